// Loaded into the SDK suites' Node processes (NODE_OPTIONS=--require, set
// by test/e2e's vitestEnv): every name under SANDSTORM_SDK_DOMAIN resolves
// to loopback, where the test's master serves the API and every
// sandbox's <port>-<id> name, as a wildcard DNS record would. The domain
// is not under .localhost on purpose: curl inside a sandbox resolves
// *.localhost to its own loopback (RFC 6761), so a sandbox could not
// reach another sandbox's URL by its name, as E2B's tests ask.
'use strict'
const dns = require('dns')
const domain = (process.env.SANDSTORM_SDK_DOMAIN || '').toLowerCase()
if (domain) {
  const lookup = dns.lookup
  const ours = (host) => {
    const h = String(host).toLowerCase().replace(/\.$/, '')
    return h === domain || h.endsWith('.' + domain)
  }
  dns.lookup = function (host, options, callback) {
    if (typeof options === 'function') {
      callback = options
      options = {}
    }
    if (!ours(host)) {
      return lookup.call(this, host, options, callback)
    }
    const opts = typeof options === 'number' ? { family: options } : options || {}
    const family = opts.family === 6 ? 6 : 4
    const address = family === 6 ? '::1' : '127.0.0.1'
    if (opts.all) {
      process.nextTick(callback, null, [{ address, family }])
    } else {
      process.nextTick(callback, null, address, family)
    }
  }
  const lookupP = dns.promises.lookup
  dns.promises.lookup = async function (host, options) {
    if (!ours(host)) {
      return lookupP.call(this, host, options)
    }
    const opts = typeof options === 'number' ? { family: options } : options || {}
    const family = opts.family === 6 ? 6 : 4
    const address = family === 6 ? '::1' : '127.0.0.1'
    return opts.all ? [{ address, family }] : { address, family }
  }
}
