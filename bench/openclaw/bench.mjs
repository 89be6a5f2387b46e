// Drives OpenClaw's own exec and process tools (the `openclaw` npm package,
// loaded in-process as shared/tools/openclaw-oracle/run.mjs does) on the
// workloads of execmesh's benchmark, and prints one JSON object per figure
// on stdout. Run by `make bench-openclaw` through execmesh-bench, which
// runs the same workloads on execmesh and prints the ratios.
//
//   ORACLE_DIR=<cache> node bench.mjs '{"calls":200,"warmup":20,"bytes":50000000,"sessions":100,"pollMs":20}'
import fs from "node:fs";

const dir = process.env.ORACLE_DIR;
if (!dir) throw new Error("ORACLE_DIR is not set");
const dist = `${dir}/node_modules/openclaw/dist`;
const barrel = fs.readdirSync(dist).find(
  (f) => /^bash-tools-.*\.mjs$/.test(f) && fs.readFileSync(`${dist}/${f}`, "utf8").includes("export { createExecTool"),
);
if (!barrel) throw new Error(`no bash-tools barrel exporting createExecTool in ${dist}`);
const { createExecTool, createProcessTool } = await import(`${dist}/${barrel}`);
const exec = createExecTool({});
const proc = createProcessTool({});
const cfg = JSON.parse(process.argv[2] ?? "{}");
const calls = cfg.calls ?? 200, warmup = cfg.warmup ?? 20, bytes = cfg.bytes ?? 50_000_000;
const sessions = cfg.sessions ?? 100, pollMs = cfg.pollMs ?? 20;

let n = 0;
const gw = (args) => ({ host: "gateway", security: "full", ask: "off", ...args });
const runExec = (args) => exec.execute(`bench-${n++}`, gw(args));
const runProc = (args) => proc.execute(`bench-${n++}`, args);
const now = () => Number(process.hrtime.bigint()) / 1e6; // ms
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const pct = (xs, p) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))];
};
const emit = (figure, value, unit) => console.log(JSON.stringify({ figure, value, unit }));
const check = (r, want, what) => {
  const st = r?.details?.status;
  if (st !== want) throw new Error(`${what}: status ${st}: ${JSON.stringify(r).slice(0, 300)}`);
  return r;
};

// 1. exec echo hi, foreground.
for (let i = 0; i < warmup; i++) check(await runExec({ command: "echo hi" }), "completed", "echo");
const lat = [];
for (let i = 0; i < calls; i++) {
  const t0 = now();
  check(await runExec({ command: "echo hi" }), "completed", "echo");
  lat.push(now() - t0);
}
emit("echo p50", pct(lat, 50), "ms");
emit("echo p99", pct(lat, 99), "ms");

// 2. A command writing `bytes` to stdout, backgrounded and polled to completion.
{
  const t0 = now();
  const r = check(await runExec({ command: `head -c ${bytes} /dev/zero`, background: true }), "running", "output");
  const id = r.details.sessionId;
  for (;;) {
    await sleep(pollMs);
    const p = await runProc({ action: "poll", sessionId: id });
    const st = p?.details?.status;
    if (st === "running") continue;
    if (st !== "completed") throw new Error(`output poll: ${JSON.stringify(p).slice(0, 300)}`);
    break;
  }
  emit("output", (now() - t0) / 1000, "s");
  await runProc({ action: "remove", sessionId: id });
}

// 3. Background sessions: start, memory, poll, list, kill.
{
  // Live JavaScript memory (heap and buffers), after a full GC: RSS of a
  // Node.js process moves with its allocator far more than 100 sessions do.
  const live = () => { globalThis.gc?.(); const m = process.memoryUsage(); return m.heapUsed + m.external; };
  await sleep(1000);
  const mem0 = live();
  const started = [];
  const t0 = now();
  for (let i = 0; i < sessions; i++) {
    const r = check(await runExec({ command: "sleep 600", background: true }), "running", "sleep");
    started.push({ id: r.details.sessionId, pid: r.details.pid });
  }
  emit("start rate", sessions / ((now() - t0) / 1000), "sessions/s");
  await sleep(2000);
  emit("memory per session", (live() - mem0) / 1024 / sessions, "KiB");
  const polls = [];
  for (let i = 0; i < 200; i++) {
    const s = started[i % started.length];
    const t = now();
    check(await runProc({ action: "poll", sessionId: s.id }), "running", "poll");
    polls.push(now() - t);
  }
  emit("poll p50", pct(polls, 50), "ms");
  const lists = [];
  for (let i = 0; i < 20; i++) {
    const t = now();
    const l = await runProc({ action: "list" });
    lists.push(now() - t);
    if ((l?.details?.sessions?.length ?? 0) < sessions) throw new Error(`list: ${JSON.stringify(l).slice(0, 300)}`);
  }
  emit("list p50", pct(lists, 50), "ms");
  const k0 = now();
  for (const s of started) await runProc({ action: "kill", sessionId: s.id });
  const alive = (pid) => { try { process.kill(pid, 0); return fs.readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1][0] !== "Z"; } catch { return false; } };
  const deadline = now() + 60000;
  let left = started.filter((s) => alive(s.pid));
  while (left.length && now() < deadline) { await sleep(20); left = left.filter((s) => alive(s.pid)); }
  emit("kill rate", sessions / ((now() - k0) / 1000), "sessions/s");
  emit("left after kill", left.length, "processes");
  for (const s of left) { try { process.kill(-s.pid, "SIGKILL"); } catch {} }
}
process.exit(0);
