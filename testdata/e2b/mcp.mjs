// E2B's MCP gateway, as the SDK's users reach it (test/e2e TestE2BMCP
// runs this with node): Sandbox.create({mcp}) unchanged, then the MCP
// SDK's own client on sbx.getMcpUrl() with sbx.getMcpToken(). The mesh
// behind it (sam-node) grants the sandbox's principal the "everything"
// server and not "present". The last line printed is the JSON report
// runFlows reads.
import assert from 'node:assert/strict'
import { Client } from '../mcp/node_modules/@modelcontextprotocol/sdk/dist/esm/client/index.js'
import { StreamableHTTPClientTransport } from '../mcp/node_modules/@modelcontextprotocol/sdk/dist/esm/client/streamableHttp.js'

const { Sandbox } = await import(process.env.E2B_MODULE ?? 'e2b')

const report = { steps: [] }
const step = async (name, fn) => {
  const t0 = performance.now()
  try {
    const out = await fn()
    report.steps.push({ name, ok: true, ms: performance.now() - t0, ...(out ?? {}) })
  } catch (e) {
    report.steps.push({ name, ok: false, ms: performance.now() - t0, error: String(e?.stack ?? e) + (e?.cause ? ` (cause: ${e.cause?.stack ?? e.cause})` : '') })
    throw e
  }
}

const meta = { run: process.env.RUN_ID }
let sbx, token
try {
  await step('Sandbox.create with mcp starts the gateway', async () => {
    sbx = await Sandbox.create({ mcp: { everything: {} }, metadata: meta, timeoutMs: 120_000 })
    token = await sbx.getMcpToken()
    assert.ok(token, 'getMcpToken')
    assert.match(sbx.getMcpUrl(), /^https:\/\/50005-[0-9a-f]+\.[^/]+\/mcp$/)
  })
  await step('the MCP SDK lists the granted tools and calls one', async () => {
    const client = new Client({ name: 'e2e-agent', version: '1' })
    await client.connect(new StreamableHTTPClientTransport(new URL(sbx.getMcpUrl()),
      { requestInit: { headers: { Authorization: `Bearer ${token}` } } }))
    const names = (await client.listTools()).tools.map((t) => t.name)
    assert.ok(names.includes('everything__echo'), `tools ${names}`)
    assert.ok(!names.some((n) => n.startsWith('present__')), `an ungranted server's tools are listed: ${names}`)
    const r = await client.callTool({ name: 'everything__echo', arguments: { message: 'hi through the gateway' } })
    assert.match(r.content[0].text, /hi through the gateway/)
    // A tool of a server the policy does not grant: refused by the mesh.
    let refused
    try {
      const d = await client.callTool({ name: 'present__echo', arguments: { message: 'x' } })
      refused = d.isError ? JSON.stringify(d.content) : ''
    } catch (e) {
      refused = String(e)
    }
    assert.ok(refused, 'present__echo ran through the gateway')
    await client.close()
    return { tools: names.length }
  })
  await step('without the token the gateway answers 401', async () => {
    const r = await fetch(sbx.getMcpUrl(), { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: '{}' })
    assert.equal(r.status, 401)
    const w = await fetch(sbx.getMcpUrl(), { method: 'POST', headers: { 'Content-Type': 'application/json', Authorization: 'Bearer not-it' }, body: '{}' })
    assert.equal(w.status, 401)
    assert.match(await w.text(), /token is wrong/)
  })
  await step('a connect reads the token back from the sandbox', async () => {
    const again = await Sandbox.connect(sbx.sandboxId)
    assert.equal(await again.getMcpToken(), token)
  })
  await step('a server the mesh does not grant: the gateway fails to start, the sandbox is killed', async () => {
    await assert.rejects(Sandbox.create({ mcp: { present: {} }, metadata: { ...meta, refused: '1' } }), /Failed to start MCP gateway.*present/s)
    const left = await Sandbox.list({ query: { metadata: { ...meta, refused: '1' } } }).nextItems()
    assert.deepEqual(left, [])
  })
  await step('a principal the policy binds to nothing: the gateway fails to start, saying so', async () => {
    await assert.rejects(Sandbox.create('mcp-unbound', { mcp: { everything: {} }, metadata: { ...meta, refused: '2' } }), /Failed to start MCP gateway.*no binding in the mesh's policy/s)
    const left = await Sandbox.list({ query: { metadata: { ...meta, refused: '2' } } }).nextItems()
    assert.deepEqual(left, [])
  })
  report.ok = true
} catch (e) {
  report.ok = false
  report.error = String(e?.message ?? e)
} finally {
  if (sbx) await sbx.kill().catch(() => {})
}
console.log(JSON.stringify(report))
