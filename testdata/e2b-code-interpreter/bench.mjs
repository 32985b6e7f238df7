// bench/interpreter's samples, taken with E2B's code interpreter SDK as a
// program would use it (the published @e2b/code-interpreter, unchanged):
// N of each series, every sample the SDK's own call timed around it. The
// last line printed is {series: [ms, …]}.
import assert from 'node:assert/strict'
import { Sandbox } from '@e2b/code-interpreter'

const N = Number(process.env.N ?? 20)
const out = {}
const add = (name, ms) => (out[name] ??= []).push(ms)
const timed = async (name, fn) => {
  const t0 = performance.now()
  const r = await fn()
  add(name, performance.now() - t0)
  return r
}

// Pooled create → first result: the template keeps a warm pool, and each
// create takes a sandbox from it; the next one waits for the pool to be
// refilled so every sample is a pooled create.
for (let i = 0; i < N; i++) {
  const t0 = performance.now()
  const sbx = await Sandbox.create({ timeoutMs: 300_000 })
  const ex = await sbx.runCode('1+1')
  add('create-pooled→first-result', performance.now() - t0)
  assert.equal(ex.text, '2')
  // The default JavaScript context's kernel starts at its first cell.
  const js = await timed('runCode-js-first', () => sbx.runCode('1+1', { language: 'js' }))
  assert.equal(js.text, '2')
  // So does a Java context's (a JVM running JShell).
  const java = await timed('runCode-java-first', () => sbx.runCode('1+1', { language: 'java' }))
  assert.equal(java.text, '2')
  await sbx.kill()
  await new Promise((r) => setTimeout(r, 1500)) // the pool's refill (a restore) is not what this series measures
}

const sbx = await Sandbox.create({ timeoutMs: 600_000 })
await sbx.runCode('import matplotlib\nimport matplotlib.pyplot as plt')
for (let i = 0; i < N * 5; i++) {
  const ex = await timed('runCode-1+1', () => sbx.runCode('1+1'))
  assert.equal(ex.text, '2')
}
for (let i = 0; i < N; i++) {
  const ex = await timed('runCode-chart', () => sbx.runCode(`plt.figure()\nplt.plot([1, ${i}, 3])\nplt.show()`))
  assert.ok(ex.results.some((r) => r.png), 'a chart came back without a PNG')
}
for (let i = 0; i < N; i++) {
  await sbx.runCode(`kept = ${i}`)
  await timed('pause', () => sbx.pause())
  const t0 = performance.now()
  await sbx.connect()
  add('connect-paused', performance.now() - t0)
  const ex = await sbx.runCode('kept')
  add('connect-paused→variable-read', performance.now() - t0)
  assert.equal(ex.text, String(i))
}
await sbx.kill()

// JavaScript's and Java's round trips, on a sandbox of their own: the
// pause and connect above restore a sandbox with Python's kernel alone,
// as before these kernels were served.
const other = await Sandbox.create({ timeoutMs: 600_000 })
for (const [language, series] of [['js', 'runCode-js-1+1'], ['java', 'runCode-java-1+1']]) {
  await other.runCode('0', { language }) // its kernel's start is runCode-*-first's
  for (let i = 0; i < N * 5; i++) {
    const ex = await timed(series, () => other.runCode('1+1', { language }))
    assert.equal(ex.text, '2')
  }
}
await other.kill()
console.log(JSON.stringify(out))
