// The E2B SDK's own flows against a running master and node
// (test/e2e/e2b_test.go runs this with node). The SDK is used unchanged:
// only E2B_API_KEY, E2B_API_URL, E2B_SANDBOX_URL and E2B_DOMAIN are set
// (and NODE_EXTRA_CA_CERTS, the master's CA). Each step checks what the
// SDK answered and throws on a difference; the last line printed is a
// JSON report the Go test reads. A second team's key is OTHER_KEY; the
// master's /v1 API (to see tiers) is SANDSTORM_API.
import assert from 'node:assert/strict'

// E2B_MODULE picks the SDK release: e2b (the current one) or e2b-2.45.
const { Sandbox, CommandExitError, NotFoundError, FileType } = await import(process.env.E2B_MODULE ?? 'e2b')

const report = { steps: [] }
const step = async (name, fn) => {
  const t0 = performance.now()
  try {
    const out = await fn()
    report.steps.push({ name, ok: true, ms: performance.now() - t0, ...(out ?? {}) })
  } catch (e) {
    report.steps.push({ name, ok: false, ms: performance.now() - t0, error: String(e?.stack ?? e) })
    throw e
  }
}

// idle takes the sandbox to an idle tier (op: freeze or snapshot)
// through the master's own API, as idleness would: not E2B's pause.
async function idle(id, op) {
  const res = await fetch(`${process.env.SANDSTORM_API}/v1/sandboxes/${id}/${op}`, {
    method: 'POST',
    headers: { Authorization: `Bearer ${process.env.E2B_API_KEY}` },
  })
  assert.equal(res.status, 200, `POST /v1/sandboxes/${id}/${op}: ${res.status}`)
}
const snapshot = (id) => idle(id, 'snapshot')

// WS_SERVER is a WebSocket echo server on port 8765 (RFC 6455 from
// Python's standard library: the base template has no websockets
// module), text frames under 126 bytes.
const WS_SERVER = `
import base64, hashlib, socket, struct, threading
def recvn(c, n):
    b = b''
    while len(b) < n:
        d = c.recv(n - len(b))
        if not d:
            raise EOFError
        b += d
    return b
def serve(c):
    h = b''
    while b'\\r\\n\\r\\n' not in h:
        h += c.recv(1024)
    key = [l.split(b':', 1)[1].strip() for l in h.split(b'\\r\\n') if l.lower().startswith(b'sec-websocket-key:')][0]
    acc = base64.b64encode(hashlib.sha1(key + b'258EAFA5-E914-47DA-95CA-C5AB0DC85B11').digest())
    c.sendall(b'HTTP/1.1 101 Switching Protocols\\r\\nUpgrade: websocket\\r\\nConnection: Upgrade\\r\\nSec-WebSocket-Accept: ' + acc + b'\\r\\n\\r\\n')
    while True:
        b0, b1 = recvn(c, 2)
        n = b1 & 127
        if n == 126:
            n = struct.unpack('>H', recvn(c, 2))[0]
        mask = recvn(c, 4)
        data = bytes(x ^ mask[i % 4] for i, x in enumerate(recvn(c, n)))
        if b0 & 15 == 8:
            c.sendall(b'\\x88\\x00')
            return
        c.sendall(bytes([0x81, len(data)]) + data)
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('0.0.0.0', 8765))
s.listen()
while True:
    threading.Thread(target=serve, args=(s.accept()[0],), daemon=True).start()
`

// echo sends msg over a WebSocket to port 8765 of sandbox id, by its
// Host (8765-<id>.<domain>) on the master's listener, and answers the
// echo. The name resolves to the listener here, whatever the resolver.
async function echo(id, msg) {
  const { default: WebSocket } = await import('ws')
  const api = new URL(process.env.E2B_SANDBOX_URL)
  const lookup = (host, opts, cb) => (opts?.all ? cb(null, [{ address: api.hostname, family: 4 }]) : cb(null, api.hostname, 4))
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(`wss://8765-${id}.${process.env.E2B_DOMAIN}:${api.port}/`, { lookup })
    ws.on('open', () => ws.send(msg))
    ws.on('message', (d) => {
      resolve(String(d))
      ws.close()
    })
    ws.on('error', reject)
  })
}

// tier reads the sandbox's tier through the master's own API, with the
// same key.
async function tier(id) {
  const res = await fetch(`${process.env.SANDSTORM_API}/v1/sandboxes/${id}`, {
    headers: { Authorization: `Bearer ${process.env.E2B_API_KEY}` },
  })
  assert.equal(res.status, 200, `GET /v1/sandboxes/${id}: ${res.status}`)
  return (await res.json()).tier
}

const wait = (ms) => new Promise((r) => setTimeout(r, ms))

let sbx
try {
  await step('create', async () => {
    sbx = await Sandbox.create('base', { timeoutMs: 120_000, metadata: { suite: 'e2e', run: process.env.RUN_ID }, envs: { FROM_CREATE: 'yes' } })
    report.sandboxID = sbx.sandboxId
  })

  await step('run foreground', async () => {
    const r = await sbx.commands.run('echo hello; echo "$FROM_CREATE"; id -un; pwd; echo oops >&2')
    assert.equal(r.exitCode, 0)
    assert.equal(r.stdout, 'hello\nyes\nuser\n/home/user\n')
    assert.equal(r.stderr, 'oops\n')
  })

  await step('exit status', async () => {
    await assert.rejects(sbx.commands.run('exit 3'), (e) => e instanceof CommandExitError && e.exitCode === 3)
  })

  await step('env, cwd, user', async () => {
    const r = await sbx.commands.run('echo "$X"; pwd; id -un', { envs: { X: 'from-call' }, cwd: '/tmp', user: 'root' })
    assert.equal(r.stdout, 'from-call\n/tmp\nroot\n')
    // The base template's user may sudo, as E2B's may; python and pip are there.
    const s = await sbx.commands.run('sudo -n id -un; python3 -c "import pip; print(pip.__name__)"')
    assert.equal(s.stdout, 'root\npip\n')
  })

  await step('stdin', async () => {
    const h = await sbx.commands.run('cat', { background: true, stdin: true })
    await sbx.commands.sendStdin(h.pid, 'through stdin\n')
    await sbx.commands.closeStdin(h.pid)
    const r = await h.wait()
    assert.equal(r.stdout, 'through stdin\n')
  })

  await step('background, list, connect, kill', async () => {
    const h = await sbx.commands.run('for i in $(seq 1000); do echo $i; sleep 0.05; done', { background: true })
    const list = await sbx.commands.list()
    assert.ok(list.some((p) => p.pid === h.pid), `pid ${h.pid} not in ${JSON.stringify(list)}`)
    await h.disconnect()
    let seen = ''
    const h2 = await sbx.commands.connect(h.pid, { onStdout: (d) => { seen += d } })
    for (let i = 0; i < 100 && !seen.includes('\n'); i++) await wait(20)
    assert.ok(seen.length > 0, 'no output after connect')
    assert.equal(await sbx.commands.kill(h.pid), true)
    await assert.rejects(h2.wait(), (e) => e instanceof CommandExitError)
    assert.equal(await sbx.commands.kill(h.pid), false)
  })

  await step('files', async () => {
    await sbx.files.write('/home/user/dir/a.txt', 'alpha')
    assert.equal(await sbx.files.read('/home/user/dir/a.txt'), 'alpha')
    assert.equal(await sbx.files.exists('/home/user/dir/a.txt'), true)
    assert.equal(await sbx.files.exists('/home/user/dir/nope'), false)
    assert.equal(await sbx.files.makeDir('/home/user/dir/sub'), true)
    assert.equal(await sbx.files.makeDir('/home/user/dir/sub'), false)
    const entries = await sbx.files.list('/home/user/dir')
    assert.deepEqual(entries.map((e) => e.name).sort(), ['a.txt', 'sub'])
    const moved = await sbx.files.rename('/home/user/dir/a.txt', '/home/user/dir/b.txt')
    assert.equal(moved.name, 'b.txt')
    const info = await sbx.files.getInfo('/home/user/dir/b.txt')
    assert.equal(info.type, FileType.FILE)
    assert.equal(info.size, 5)
    assert.equal(info.owner, 'user')
    await sbx.files.remove('/home/user/dir/b.txt')
    await assert.rejects(sbx.files.read('/home/user/dir/b.txt'), (e) => e instanceof NotFoundError)
    // Paths are the sandbox's own: .. and absolute paths never leave it.
    const passwd = await sbx.files.read('/home/user/../../etc/passwd')
    assert.match(passwd, /^user:x:1000:1000:/m)
    // File metadata (envd 0.6.2) and a gzip upload (octet-stream).
    await sbx.files.write('/home/user/meta.txt', 'm', { metadata: { owner: 'team-a' } })
    assert.equal((await sbx.files.getInfo('/home/user/meta.txt')).metadata?.owner, 'team-a')
    await sbx.files.write('/home/user/zipped.txt', 'sent gzipped', { gzip: true })
    assert.equal(await sbx.files.read('/home/user/zipped.txt'), 'sent gzipped')
    // 1 MiB round trip.
    const big = new Uint8Array(1 << 20).map((_, i) => (i * 7) & 0xff)
    await sbx.files.write('/home/user/big.bin', big)
    const back = await sbx.files.read('/home/user/big.bin', { format: 'bytes' })
    assert.equal(Buffer.compare(Buffer.from(back), Buffer.from(big)), 0)
  })

  await step('watchDir', async () => {
    const events = []
    const w = await sbx.files.watchDir('/home/user/dir', (e) => events.push(e), { recursive: true })
    await sbx.files.write('/home/user/dir/watched.txt', 'x')
    for (let i = 0; i < 200 && !events.some((e) => e.name === 'watched.txt'); i++) await wait(10)
    await w.stop()
    assert.ok(events.some((e) => e.name === 'watched.txt'), `events: ${JSON.stringify(events)}`)
  })

  await step('pause is a snapshot; connect wakes it with memory and files', async () => {
    const h = await sbx.commands.run('i=0; while true; do i=$((i+1)); echo $i > /tmp/count; sleep 0.05; done', { background: true })
    await wait(300)
    const before = Number((await sbx.commands.run('cat /tmp/count')).stdout)
    await sbx.pause()
    assert.equal(await tier(sbx.sandboxId), 'snapshot')
    const listed = await Sandbox.list({ query: { state: ['paused'], metadata: { run: process.env.RUN_ID } } }).nextItems()
    assert.deepEqual(listed.map((s) => s.sandboxId), [sbx.sandboxId])
    const t0 = performance.now()
    const again = await Sandbox.connect(sbx.sandboxId)
    const connectMs = performance.now() - t0
    assert.equal(await tier(sbx.sandboxId), 'hot')
    // /tmp is memory: the loop's counter went on from where it was.
    const after = Number((await again.commands.run('cat /tmp/count')).stdout)
    assert.ok(after >= before, `count ${after} after the wake, ${before} before: memory lost`)
    assert.equal(await again.files.exists('/home/user/big.bin'), true)
    assert.ok((await again.commands.list()).some((p) => p.pid === h.pid), 'the background loop is gone after the wake')
    await again.commands.kill(h.pid)
    return { connectMs }
  })

  await step('a command in a sandbox snapshotted by idleness wakes it', async () => {
    await snapshot(sbx.sandboxId)
    assert.equal(await sbx.isRunning(), true, 'an idle tier is running to E2B')
    // Not through connect: the command itself wakes it.
    const r = await sbx.commands.run('echo awake')
    assert.equal(r.stdout, 'awake\n')
    assert.equal(await tier(sbx.sandboxId), 'hot')
  })

  await step('a port passes a WebSocket, and one wakes the sandbox from an idle snapshot', async () => {
    await sbx.files.write('/home/user/ws.py', WS_SERVER)
    const srv = await sbx.commands.run('python3 /home/user/ws.py', { background: true })
    let got = ''
    for (let i = 0; i < 100 && got !== 'one'; i++) {
      got = await echo(sbx.sandboxId, 'one').catch(() => wait(50).then(() => ''))
    }
    assert.equal(got, 'one', 'a WebSocket through the port')
    await snapshot(sbx.sandboxId)
    assert.equal(await tier(sbx.sandboxId), 'snapshot')
    assert.equal(await echo(sbx.sandboxId, 'two'), 'two', 'a WebSocket to the snapshotted sandbox')
    assert.equal(await tier(sbx.sandboxId), 'hot')
    await sbx.commands.kill(srv.pid)
  })

  await step('watchDir streams on across an idle freeze', async () => {
    const events = []
    const w = await sbx.files.watchDir('/home/user', (e) => events.push(e))
    await idle(sbx.sandboxId, 'freeze')
    assert.equal(await tier(sbx.sandboxId), 'frozen')
    await sbx.files.write('/home/user/after-freeze.txt', 'x') // wakes it
    for (let i = 0; i < 200 && !events.some((e) => e.name === 'after-freeze.txt'); i++) await wait(10)
    await w.stop()
    assert.ok(events.some((e) => e.name === 'after-freeze.txt'), `events after the freeze: ${JSON.stringify(events)}`)
  })

  await step('a paused sandbox is paused until connect', async () => {
    await sbx.pause()
    assert.equal(await sbx.isRunning(), false, 'paused, isRunning')
    await assert.rejects(sbx.commands.run('echo no'), 'a command in a paused sandbox')
    assert.equal(await tier(sbx.sandboxId), 'snapshot')
    await sbx.connect()
    assert.equal((await sbx.commands.run('echo awake')).stdout, 'awake\n')
  })

  await step('list: metadata, state, paging', async () => {
    const others = await Promise.all([1, 2].map(() => Sandbox.create('base', { timeoutMs: 120_000, metadata: { suite: 'e2e', run: process.env.RUN_ID } })))
    const p = Sandbox.list({ query: { metadata: { run: process.env.RUN_ID }, state: ['running'] }, limit: 2 })
    const first = await p.nextItems()
    assert.equal(first.length, 2)
    assert.equal(p.hasNext, true)
    const second = await p.nextItems()
    assert.equal(second.length, 1)
    assert.equal(p.hasNext, false)
    const ids = [...first, ...second].map((s) => s.sandboxId).sort()
    assert.deepEqual(ids, [sbx.sandboxId, ...others.map((o) => o.sandboxId)].sort())
    assert.equal((await Sandbox.list({ query: { metadata: { run: 'no-such-run' } } }).nextItems()).length, 0)
    await Promise.all(others.map((o) => o.kill()))
  })

  await step('another team cannot see it', async () => {
    const opts = { apiKey: process.env.OTHER_KEY }
    await assert.rejects(Sandbox.connect(sbx.sandboxId, opts), (e) => e instanceof NotFoundError || /not found/i.test(String(e)))
    assert.equal(await Sandbox.kill(sbx.sandboxId, opts), false)
    assert.equal((await Sandbox.list({ ...opts, query: { metadata: { run: process.env.RUN_ID } } }).nextItems()).length, 0)
    await assert.rejects(Sandbox.getInfo(sbx.sandboxId, opts))
  })

  await step('no timeoutMs: the SDKs\' 5 minutes', async () => {
    // e2b 2.45 sends 300 s unless told; 2.51 sends none and leaves it to
    // the server, which must not end the sandbox 15 s in (E2B's spec's
    // figure for a bare API call).
    const s = await Sandbox.create('base')
    const info = await s.getInfo()
    const lifetime = (new Date(info.endAt) - new Date(info.startedAt)) / 1000
    assert.ok(lifetime >= 299 && lifetime <= 301, `a create without timeoutMs lives ${lifetime} s, want 300`)
    // A connect without one leaves it as long (it only lengthens).
    await Sandbox.connect(s.sandboxId)
    const after = await s.getInfo()
    assert.ok(new Date(after.endAt) >= new Date(info.endAt), `a connect shortened it: ${after.endAt} < ${info.endAt}`)
    await s.kill()
    return { lifetimeS: lifetime }
  })

  await step('timeout kills', async () => {
    const s = await Sandbox.create('base', { timeoutMs: 2000 })
    const t0 = Date.now()
    let goneAt = 0
    for (let i = 0; i < 400; i++) {
      const l = await Sandbox.list({ query: { state: ['running', 'paused'] } }).nextItems()
      if (!l.some((x) => x.sandboxId === s.sandboxId)) { goneAt = Date.now(); break }
      await wait(25)
    }
    assert.ok(goneAt > 0, 'not killed at its timeout')
    return { killedAfterMs: goneAt - t0 }
  })

  await step('timeout with autoPause snapshots', async () => {
    const s = await Sandbox.create('base', { timeoutMs: 2000, lifecycle: { onTimeout: 'pause' } })
    await s.commands.run('echo kept > /home/user/kept.txt')
    let paused = false
    for (let i = 0; i < 400 && !paused; i++) {
      const l = await Sandbox.list({ query: { state: ['paused'] } }).nextItems()
      paused = l.some((x) => x.sandboxId === s.sandboxId)
      if (!paused) await wait(25)
    }
    assert.ok(paused, 'not paused at its timeout')
    assert.equal(await tier(s.sandboxId), 'snapshot')
    const again = await Sandbox.connect(s.sandboxId)
    assert.equal((await again.commands.run('cat /home/user/kept.txt')).stdout, 'kept\n')
    await again.kill()
  })

  await step('kill', async () => {
    await sbx.kill()
    assert.equal(await Sandbox.kill(sbx.sandboxId), false)
    await assert.rejects(Sandbox.connect(sbx.sandboxId), (e) => e instanceof NotFoundError || /not found/i.test(String(e)))
  })
  report.ok = true
} catch (e) {
  report.ok = false
  report.error = String(e?.stack ?? e)
}
console.log(JSON.stringify(report))
