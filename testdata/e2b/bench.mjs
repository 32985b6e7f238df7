// SDK-side timings of the E2B API (bench/e2b runs this with node, against
// a daemon it started): the SDK used unchanged, as in flows.mjs. Prints
// one JSON object of raw samples in ms per series; bench/e2b writes the
// results file. SANDSTORM_API and SANDSTORM_TOKEN (the operator's) are
// used to move sandboxes between tiers and to see the warm pool refill.
import { Sandbox } from 'e2b'

const N = Number(process.env.N ?? 20)
const api = process.env.SANDSTORM_API
const op = { Authorization: `Bearer ${process.env.SANDSTORM_TOKEN}` }
const out = {}
const add = (name, ms) => (out[name] ??= []).push(ms)
const wait = (ms) => new Promise((r) => setTimeout(r, ms))
const progress = (s) => process.stderr.write(s + '\n')

// poolReady waits until the node in the master's process has a pooled
// sandbox of template: GET /v1/node reads it now (GET /v1/nodes shows
// each node's last heartbeat, up to a second old).
async function poolReady(template) {
  for (let i = 0; i < 600; i++) {
    const r = await fetch(`${api}/v1/node`, { headers: op })
    if (((await r.json()).warm_pool?.[template] ?? 0) > 0) return
    await wait(50)
  }
  throw new Error(`the warm pool of ${template} did not refill in 30 s`)
}

async function transition(id, op_) {
  const r = await fetch(`${api}/v1/sandboxes/${id}/${op_}`, { method: 'POST', headers: op })
  if (r.status !== 200) throw new Error(`${op_} ${id}: ${r.status} ${await r.text()}`)
}

const time = async (fn) => {
  const t0 = performance.now()
  await fn()
  return performance.now() - t0
}

// Create → the first command's result: from the warm pool (a restored,
// paused sandbox taken by the create), and cold (a template without a
// warm image: runsc run of envd as init and its process).
for (const [series, template, pooled] of [['create-pooled→first-run', 'base', true], ['create-cold→first-run', 'base-cold', false]]) {
  for (let i = 0; i < N; i++) {
    if (pooled) await poolReady(template)
    let s
    add(series, await time(async () => {
      s = await Sandbox.create(template, { timeoutMs: 300_000 })
      await s.commands.run('true')
    }))
    await s.kill()
  }
  progress(`${series}: ${N} samples`)
}

const s = await Sandbox.create('base', { timeoutMs: 600_000 })
await s.commands.run('true')
for (let i = 0; i < 5 * N; i++) add('run-echo', await time(() => s.commands.run('echo hi')))
progress(`run-echo: ${5 * N} samples`)
// The floor under run-echo: the same command started inside the sandbox
// by a program already running there (Python's subprocess), as user —
// gVisor's own cost of a process, with no API, network or SDK.
const floor = await s.commands.run(`python3 -c "
import json, subprocess, time
out = []
for _ in range(${5 * N}):
    t = time.perf_counter()
    subprocess.run(['/bin/bash', '-l', '-c', 'echo hi'], stdout=subprocess.PIPE, check=True)
    out.append((time.perf_counter() - t) * 1000)
print(json.dumps(out))
"`)
for (const ms of JSON.parse(floor.stdout)) add('raw-echo-in-sandbox', ms)

for (const [mib, n] of [[1, N], [100, Math.max(3, Math.floor(N / 4))]]) {
  const data = new Uint8Array(mib << 20).map((_, i) => (i * 31) & 0xff)
  for (let i = 0; i < n; i++) {
    add(`write-${mib}MiB`, await time(() => s.files.write('/home/user/bench.bin', data)))
    add(`read-${mib}MiB`, await time(async () => {
      const b = await s.files.read('/home/user/bench.bin', { format: 'bytes' })
      if (b.length !== data.length) throw new Error(`read ${b.length} bytes of ${data.length}`)
    }))
    if (mib < 100) continue
    add(`read-${mib}MiB-stream`, await time(async () => {
      let got = 0
      for await (const chunk of await s.files.read('/home/user/bench.bin', { format: 'stream' })) got += chunk.length
      if (got !== data.length) throw new Error(`streamed ${got} bytes of ${data.length}`)
    }))
    // The same multipart upload by Node's own fetch, through sandstormd to
    // the sandbox's envd as the SDK sends it (E2B_SANDBOX_URL, its
    // headers): what the SDK itself adds is the difference.
    add(`fetch-formdata-up-${mib}MiB`, await time(async () => {
      const fd = new FormData()
      fd.append('file', new Blob([data]), 'bench.bin')
      const r = await fetch(`${process.env.E2B_SANDBOX_URL}/files?path=/home/user/bench.bin&username=user`, {
        method: 'POST', body: fd, headers: { 'E2b-Sandbox-Id': s.sandboxId, 'X-Access-Token': s.envdAccessToken },
      })
      if (r.status !== 200) throw new Error(`multipart upload: ${r.status} ${await r.text()}`)
      await r.text()
    }))
    // Node's own floor: the same bytes over TLS to a server on loopback
    // that only discards them, or only sends them (bench/e2b, baseline.go).
    add(`baseline-fetch-up-${mib}MiB`, await time(async () => {
      const r = await fetch(`${process.env.BASELINE_URL}/up`, { method: 'POST', body: data, headers: { 'Content-Type': 'application/octet-stream' } })
      await r.text()
    }))
    add(`baseline-fetch-down-${mib}MiB`, await time(async () => {
      const b = new Uint8Array(await (await fetch(`${process.env.BASELINE_URL}/down?mib=${mib}`)).arrayBuffer())
      if (b.length !== data.length) throw new Error(`fetched ${b.length} bytes of ${data.length}`)
    }))
  }
  progress(`write/read ${mib} MiB: ${n} samples`)
}

// connect from each tier: the sandbox moved there through the API, then
// Sandbox.connect (it wakes it) and the first command's result.
for (const [tier, op_] of [['hot', null], ['frozen', 'freeze'], ['snapshot', 'snapshot'], ['detached', 'detach']]) {
  for (let i = 0; i < N; i++) {
    if (op_) await transition(s.sandboxId, op_)
    let c
    add(`connect-from-${tier}`, await time(async () => { c = await Sandbox.connect(s.sandboxId) }))
    if (op_) {
      // The node's own time for the wake (its last_wake_ms).
      const sb = await (await fetch(`${api}/v1/sandboxes/${s.sandboxId}`, { headers: op })).json()
      if (sb.last_wake_from === tier) add(`connect-from-${tier}/node-wake`, sb.last_wake_ms)
    }
    add(`connect-from-${tier}→first-run`, await time(() => c.commands.run('true')))
  }
  progress(`connect from ${tier}: ${N} samples`)
}
// E2B's pause (issue 31): pause() of sbx until isRunning() says false,
// then connect() until the first command's result; n times, into the
// series named with suffix.
async function pauseConnect(sbx, suffix, n) {
  for (let i = 0; i < n; i++) {
    add('pause→not-running' + suffix, await time(async () => {
      await sbx.pause()
      if (await sbx.isRunning()) throw new Error('running after pause()')
    }))
    add('connect-paused→first-run' + suffix, await time(async () => {
      // A resumed sandbox's lifetime is what the connect gives (E2B's
      // default is 15 s): the rest of the run needs it.
      const c = await Sandbox.connect(sbx.sandboxId, { timeoutMs: 600_000 })
      await c.commands.run('true')
    }))
  }
}
await pauseConnect(s, '', N)
progress(`pause and connect: ${N} samples`)

// The same with a process holding a heap of HEAP_MIB (the 1 GiB):
// what pause and connect cost when there is memory to save and restore.
const heapMiB = Number(process.env.HEAP_MIB ?? 0)
if (heapMiB > 0) {
  const h = await Sandbox.create('base-1g', { timeoutMs: 600_000 })
  await h.commands.run(`python3 -c "
import time
b = bytearray(${heapMiB} << 20)
for i in range(0, len(b), 4096):
    b[i] = 1
open('/tmp/heap-ready', 'w').write('1')
time.sleep(1e9)
"`, { background: true })
  for (let i = 0; i < 1200 && !(await h.files.exists('/tmp/heap-ready')); i++) await wait(50)
  if (!(await h.files.exists('/tmp/heap-ready'))) throw new Error(`the ${heapMiB} MiB heap was not filled in 60 s`)
  const hn = Number(process.env.HEAP_N ?? 3)
  await pauseConnect(h, '/heap1g', hn)
  if (!(await h.files.exists('/tmp/heap-ready'))) throw new Error('the heap is gone after the pauses')
  await h.kill()
  progress(`pause and connect, ${heapMiB} MiB heap: ${hn} samples`)
}

// Snapshots: createSnapshot, and a sandbox from it to its first command.
for (let i = 0; i < N; i++) {
  let snap, f
  add('createSnapshot', await time(async () => { snap = await s.createSnapshot() }))
  add('create-from-snapshot→first-run', await time(async () => {
    f = await Sandbox.create(snap.snapshotId, { timeoutMs: 120_000 })
    await f.commands.run('true')
  }))
  await f.kill()
  await Sandbox.deleteSnapshot(snap.snapshotId)
}
progress(`snapshots: ${N} samples`)

// Fork of 1 and of 10: the call until every fork is running.
for (const [count, n] of [[1, N], [10, Math.max(3, Math.floor(N / 5))]]) {
  for (let i = 0; i < n; i++) {
    let forks
    add(`fork-${count}`, await time(async () => { forks = await s.fork({ count, timeoutMs: 120_000 }) }))
    if (forks.length !== count) throw new Error(`fork of ${count}: ${forks.length}`)
    await Promise.all(forks.map((f) => f.kill()))
  }
  progress(`fork of ${count}: ${n} samples`)
}

// A port of the sandbox (getHost's name, here by its headers) while it
// is in the snapshot tier by idleness: the request wakes it.
await s.commands.run('python3 -m http.server 8000 >/dev/null 2>&1', { background: true })
const port = { 'E2b-Sandbox-Id': s.sandboxId, 'E2b-Sandbox-Port': '8000' }
for (let i = 0; i < 100; i++) {
  const r = await fetch(process.env.E2B_SANDBOX_URL + '/', { headers: port }).catch(() => null)
  if (r?.status === 200) { await r.text(); break }
  await wait(50)
}
for (let i = 0; i < N; i++) {
  await transition(s.sandboxId, 'snapshot')
  add('port-from-snapshot', await time(async () => {
    const r = await fetch(process.env.E2B_SANDBOX_URL + '/', { headers: port })
    if (r.status !== 200) throw new Error(`port 8000: ${r.status}`)
    await r.text()
  }))
}
progress(`port from snapshot: ${N} samples`)

// watchDir: from a write's start to its event.
await s.files.makeDir('/home/user/watched')
let seen
const w = await s.files.watchDir('/home/user/watched', (e) => { if (e.type === 'write' && seen) seen(e) })
for (let i = 0; i < 5 * N; i++) {
  const got = new Promise((r) => { seen = r })
  const t0 = performance.now()
  await Promise.all([s.files.write(`/home/user/watched/f${i % 4}.txt`, `x${i}`), got])
  add('watch-write→event', performance.now() - t0)
}
await w.stop()
progress(`watch: ${5 * N} samples`)

await s.kill()
console.log(JSON.stringify(out))
