// E2B's code interpreter SDK, as published and unchanged, against a
// running master and node (test/e2e/codeinterpreter_test.go runs this
// with node; only E2B_API_KEY, E2B_API_URL, E2B_SANDBOX_URL, E2B_DOMAIN
// and NODE_EXTRA_CA_CERTS point it here). Each step checks what the SDK
// answered and throws on a difference; the last line printed is a JSON
// report the Go test reads, with the chart's PNG (base64) for it to
// decode. SANDSTORM_API is the master's /v1 API, to take the sandbox to
// an idle tier as idleness would.
import assert from 'node:assert/strict'
import { Sandbox } from '@e2b/code-interpreter'

const report = { steps: [] }
const step = async (name, fn) => {
  const t0 = performance.now()
  try {
    const out = await fn()
    report.steps.push({ name, ok: true, ms: performance.now() - t0 })
    return out
  } catch (e) {
    report.steps.push({ name, ok: false, ms: performance.now() - t0, error: String(e?.stack ?? e) })
    throw e
  }
}

async function idle(id, op) {
  const res = await fetch(`${process.env.SANDSTORM_API}/v1/sandboxes/${id}/${op}`, {
    method: 'POST',
    headers: { Authorization: `Bearer ${process.env.E2B_API_KEY}` },
  })
  assert.equal(res.status, 200, `POST /v1/sandboxes/${id}/${op}: ${res.status} ${await res.text()}`)
}

let sbx
try {
  sbx = await step('create from code-interpreter-v1 (the SDK default)', () => Sandbox.create({ timeoutMs: 600_000 }))

  await step('a cell: streamed stdout and stderr, its value, its count', async () => {
    const out = [], err = []
    const ex = await sbx.runCode('import sys\nprint("to stdout")\nprint("to stderr", file=sys.stderr)\nx = 6 * 7\nx', {
      onStdout: (m) => out.push(m.line),
      onStderr: (m) => err.push(m.line),
    })
    assert.equal(ex.text, '42')
    assert.deepEqual(out, ['to stdout\n'])
    assert.deepEqual(err, ['to stderr\n'])
    assert.deepEqual(ex.logs, { stdout: ['to stdout\n'], stderr: ['to stderr\n'] })
    assert.equal(typeof ex.executionCount, 'number')
    assert.equal(ex.error, undefined)
  })

  await step('an error: name, value, traceback', async () => {
    const ex = await sbx.runCode('{}["missing"]')
    assert.equal(ex.error?.name, 'KeyError')
    assert.equal(ex.error?.value, "'missing'")
    assert.match(ex.error?.traceback ?? '', /KeyError/)
  })

  report.png = await step('a matplotlib chart comes back as a PNG', async () => {
    const ex = await sbx.runCode('import matplotlib.pyplot as plt\nplt.bar(["a", "b", "c"], [3, 1, 2])\nplt.title("sandstorm")\nplt.show()')
    assert.equal(ex.error, undefined, JSON.stringify(ex.error))
    assert.equal(ex.results.length, 1)
    assert.ok(ex.results[0].png, `formats: ${ex.results[0].formats()}`)
    return ex.results[0].png
  })

  await step('a DataFrame: html and its columns as data', async () => {
    const ex = await sbx.runCode('import pandas as pd\npd.DataFrame({"n": [1, 2], "s": ["x", "y"]})')
    const r = ex.results[0]
    assert.match(r.html ?? '', /<table/)
    assert.deepEqual(r.data, { n: [1, 2], s: ['x', 'y'] })
  })

  await step('contexts are kept apart; a restart forgets', async () => {
    const ctx = await sbx.createCodeContext({ cwd: '/tmp' })
    await sbx.runCode('secret = 1', { context: ctx })
    assert.equal((await sbx.runCode('"secret" in globals()')).text, 'False')
    assert.equal((await sbx.runCode('import os; os.getcwd()', { context: ctx })).text, '/tmp')
    await sbx.restartCodeContext(ctx)
    assert.equal((await sbx.runCode('"secret" in globals()', { context: ctx })).text, 'False')
    await sbx.removeCodeContext(ctx)
  })

  await step('JavaScript: a package published as ESM only, by import and by import(), from the working directory', async () => {
    const cwd = (await sbx.runCode('process.cwd()', { language: 'js' })).text
    const pkg = `${cwd}/node_modules/esm-only`
    await sbx.files.write(`${pkg}/package.json`, JSON.stringify({ name: 'esm-only', type: 'module', exports: { '.': { import: './index.js' } } }))
    await sbx.files.write(`${pkg}/index.js`, "export default 'hello'; export const shout = (s) => s.toUpperCase() + '!'")
    const declared = await sbx.runCode("import greeting, { shout } from 'esm-only'\nshout(greeting)", { language: 'js' })
    assert.equal(declared.text, 'HELLO!', JSON.stringify(declared.error))
    const dynamic = await sbx.runCode("(await import('esm-only')).shout('dynamic')", { language: 'ts' })
    assert.equal(dynamic.text, 'DYNAMIC!', JSON.stringify(dynamic.error))
  })

  await step('a timeout interrupts the kernel', async () => {
    await assert.rejects(sbx.runCode('import time; time.sleep(3600)', { timeoutMs: 2_000 }))
    assert.equal((await sbx.runCode('x', { timeoutMs: 60_000 })).text, '42')
  })

  // Python's variable, and JavaScript's (a kernel of the server's own).
  const bothKept = async () => {
    assert.equal((await sbx.runCode('kept')).text, 'before the pause')
    assert.equal((await sbx.runCode('keptJs', { language: 'js' })).text, 'js before the pause')
  }
  await step('set a variable, pause, connect: it is there', async () => {
    await sbx.runCode('kept = "before the pause"')
    await sbx.runCode('const keptJs = "js before the pause"', { language: 'js' })
    await sbx.pause()
    sbx = await Sandbox.connect(sbx.sandboxId, { timeoutMs: 600_000 })
    await bothKept()
  })

  for (const op of ['freeze', 'snapshot']) {
    await step(`after an idle ${op}: it is there`, async () => {
      await idle(sbx.sandboxId, op)
      await bothKept()
    })
  }
  await step('after an idle detach (a cold start): the first call waits for the server, on new kernels', async () => {
    await idle(sbx.sandboxId, 'detach')
    const ex = await sbx.runCode('1 + 1')
    assert.equal(ex.text, '2', `after a cold start: ${JSON.stringify(ex.error)}`)
    const gone = await sbx.runCode('kept')
    assert.equal(gone.error?.name, 'NameError', 'a cold start kept the memory')
  })
  report.ok = true
} catch (e) {
  report.ok = false
  report.error = String(e?.message ?? e)
} finally {
  if (sbx) await sbx.kill().catch(() => {})
}
console.log(JSON.stringify(report))
