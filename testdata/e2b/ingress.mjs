// E2B's SDK, unchanged, through a node's ingress (test/e2e TestIngress
// runs this with node): Sandbox.connect goes to the master's API
// (E2B_API_URL), and every call to the sandbox's envd to the URL the SDK
// is given for sandboxes (E2B_SANDBOX_URL), here one node's ingress, which
// serves the fleet's sandboxes wherever they are. The last line printed
// is the JSON report runFlows reads.
import assert from 'node:assert/strict'

const { Sandbox } = await import(process.env.E2B_MODULE ?? 'e2b')

const report = { steps: [] }
const step = async (name, fn) => {
  const t0 = performance.now()
  try {
    await fn()
    report.steps.push({ name, ok: true, ms: performance.now() - t0 })
  } catch (e) {
    report.steps.push({ name, ok: false, ms: performance.now() - t0, error: String(e?.stack ?? e) + (e?.cause ? ` (cause: ${e.cause?.stack ?? e.cause})` : '') })
    throw e
  }
}

let sbx
try {
  await step('Sandbox.connect through the master', async () => {
    sbx = await Sandbox.connect(process.env.SANDBOX_ID)
  })
  await step('commands.run through the ingress', async () => {
    const r = await sbx.commands.run('cat /tmp/mark')
    assert.equal(r.stdout, 'here\n')
  })
  await step('files write and read through the ingress', async () => {
    await sbx.files.write('/tmp/via-sdk.txt', 'written through a node')
    assert.equal(await sbx.files.read('/tmp/via-sdk.txt'), 'written through a node')
  })
  await step('a streamed command through the ingress', async () => {
    const seen = []
    const r = await sbx.commands.run('for i in 1 2 3; do echo $i; done', { onStdout: (d) => seen.push(d) })
    assert.equal(r.exitCode, 0)
    assert.equal(seen.join(''), '1\n2\n3\n')
  })
  report.ok = true
} catch (e) {
  report.ok = false
  report.error = String(e?.message ?? e)
}
console.log(JSON.stringify(report))
