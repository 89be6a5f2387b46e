// Shared helpers for the conformance generators: locate OpenClaw's bundled modules, expose the few
// functions the bundle keeps private, and write fixture files.
//
// The oracle install (openclaw + a Node.js 26 runtime) lives in $ORACLE_DIR, default
// $HOME/.cache/openclaw-oracle (../../tools/openclaw-oracle/setup.sh creates it).
//
// Bundled modules have hashed names (bash-tools-B2oth0P7.mjs) and rename their exports to single
// letters (`export { encodeKeySequence as a, ... }`), so functions are found by their declaration
// text and reached through the letter that the module's final export statement maps them to.
// A function the bundle does not export at all is reached with a module load hook that appends
// `export { fn as __oc_fn }` to that one module's source as Node loads it: OpenClaw's own code runs
// unmodified, in its real module with its real imports; only an extra export name is added.
import fs from "node:fs";
import path from "node:path";
import module from "node:module";
import { fileURLToPath, pathToFileURL } from "node:url";

export const ORACLE_DIR = process.env.ORACLE_DIR || `${process.env.HOME}/.cache/openclaw-oracle`;
export const PKG_DIR = path.join(ORACLE_DIR, "node_modules", "openclaw");
export const DIST = path.join(PKG_DIR, "dist");
if (!fs.existsSync(DIST)) {
  console.error(`OpenClaw not found under ${ORACLE_DIR}; run bench/openclaw/setup.sh "$ORACLE_DIR" from the repository root (or set ORACLE_DIR).`);
  process.exit(2);
}
export const OPENCLAW_VERSION = JSON.parse(fs.readFileSync(path.join(PKG_DIR, "package.json"), "utf8")).version;
export const NODE_VERSION = process.version;
export const OUT_DIR = process.env.CONFORMANCE_OUT
  ? path.resolve(process.env.CONFORMANCE_OUT)
  : path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");

const distFiles = fs.readdirSync(DIST).filter((f) => f.endsWith(".mjs")).sort();
const textCache = new Map();
function read(file) {
  let t = textCache.get(file);
  if (t === undefined) {
    t = fs.readFileSync(path.join(DIST, file), "utf8");
    textCache.set(file, t);
  }
  return t;
}

/** The one dist module whose source contains `marker`; `stem` (a file-name prefix) narrows the search. */
export function findModule(marker, stem) {
  const pool = stem ? distFiles.filter((f) => f.startsWith(stem)) : distFiles;
  let hits = pool.filter((f) => read(f).includes(marker));
  if (hits.length === 0 && stem) hits = distFiles.filter((f) => read(f).includes(marker));
  if (hits.length !== 1) throw new Error(`expected one dist module containing ${JSON.stringify(marker)}, found ${hits.length}: ${hits.join(", ")}`);
  return hits[0];
}

/** name -> exported letter, from the module's final `export { a as b, ... }` statement. */
export function exportMap(file) {
  const src = read(file);
  const m = [...src.matchAll(/^export \{([^}]*)\};?\s*$/gm)].pop();
  const map = {};
  if (!m) return map;
  for (const part of m[1].split(",")) {
    const [local, , alias] = part.trim().split(/\s+/);
    if (local) map[local] = alias ?? local;
  }
  return map;
}

// Private functions/constants to expose, by the declaration that identifies their module.
const INTERNALS = [
  { marker: "function encodeKeySequence(", stem: "bash-tools-",
    names: ["encodeKeySequence", "encodePaste", "hasCursorModeSensitiveKeys", "namedKeyMap", "resolveLogSliceWindow", "defaultTailNote"] },
  { marker: "function maybeNotifyOnExit(", stem: "bash-tools.exec-runtime-", names: ["maybeNotifyOnExit"] },
  { marker: "blockedOverrideOnlyKeys", stem: "host-env-security-",
    names: ["HOST_ENV_SECURITY_POLICY", "host_env_security_policy_default", "CARGO_TARGET_EXECUTABLE_OVERRIDE_ENV_KEY"] },
];
const exposed = new Map(); // file -> [names]
for (const spec of INTERNALS) {
  const file = findModule(spec.marker, spec.stem);
  const src = read(file);
  const names = spec.names.filter((n) => new RegExp(`^(?:async )?(?:function|const|let|var) ${n.replace(/\$/g, "\\$")}\\b`, "m").test(src));
  const missing = spec.names.filter((n) => !names.includes(n));
  if (missing.length) throw new Error(`${file}: declarations not found: ${missing.join(", ")}`);
  exposed.set(file, names);
}
module.registerHooks({
  load(url, context, nextLoad) {
    const result = nextLoad(url, context);
    if (!url.startsWith("file:")) return result;
    const file = path.basename(fileURLToPath(url));
    const names = exposed.get(file);
    if (!names || path.dirname(fileURLToPath(url)) !== DIST) return result;
    const source = String(result.source) + `\nexport { ${names.map((n) => `${n} as __oc_${n}`).join(", ")} };\n`;
    return { ...result, source };
  },
});

/** Import a dist module by file name. */
export async function importDist(file) {
  return import(pathToFileURL(path.join(DIST, file)).href);
}

/**
 * OpenClaw function or constant `name`, declared in the module that contains `marker`
 * (default `function <name>(`). Returns { value, file, via } where via is the export letter or "hook".
 */
export async function oc(name, marker = `function ${name}(`, stem) {
  const file = findModule(marker, stem);
  const mod = await importDist(file);
  const letter = exportMap(file)[name];
  if (letter !== undefined && letter in mod) return { value: mod[letter], file, via: `export ${letter}` };
  if (`__oc_${name}` in mod) return { value: mod[`__oc_${name}`], file, via: "hook" };
  throw new Error(`${name} is neither exported by nor exposed from ${file}`);
}

/** Describe where a function came from, for the fixtures' "source" field. */
export function where(name, r) {
  return r.via === "hook"
    ? `${name} (dist/${r.file}, module-private; reached by appending an export at load time)`
    : `${name} (dist/${r.file}, bundled export "${r.via.slice(7)}")`;
}

/** Write one fixture file as pretty JSON. */
export function writeFixture(name, obj) {
  const body = JSON.stringify(obj, null, 2) + "\n";
  assertNoMachinePaths(name, body);
  fs.mkdirSync(OUT_DIR, { recursive: true });
  fs.writeFileSync(path.join(OUT_DIR, name), body);
  const n = Array.isArray(obj.cases) ? obj.cases.length : 0;
  console.log(`${name}: ${n} cases`);
}

/** Refuse to write absolute paths of the generating machine into a fixture. */
export function assertNoMachinePaths(name, body) {
  const home = process.env.HOME && process.env.HOME.length > 1 ? `${process.env.HOME}/` : undefined;
  const bad = [ORACLE_DIR, home, process.cwd(), OUT_DIR].filter((p) => p && p.length > 1 && body.includes(p));
  if (bad.length) throw new Error(`${name} would contain machine paths: ${bad.join(", ")}`);
}

/** Bytes of a Buffer/string as lower-case hex without separators. */
export function hex(data) {
  return Buffer.from(data).toString("hex");
}

export function header(source, notes) {
  return { openclawVersion: OPENCLAW_VERSION, source, notes };
}

/** OpenClaw's exec and process tools (the same factories the oracle uses). */
export async function loadTools(options = {}) {
  const barrel = distFiles.find((f) => /^bash-tools-.*\.mjs$/.test(f) && read(f).includes("export { createExecTool"));
  if (!barrel) throw new Error("bash-tools barrel not found");
  const { createExecTool, createProcessTool } = await importDist(barrel);
  const exec = createExecTool(options);
  const proc = createProcessTool(options);
  let n = 0;
  const call = async (tool, args) => {
    const full = tool === "exec" ? { host: "gateway", security: "full", ask: "off", ...args } : args;
    try {
      const r = await (tool === "exec" ? exec : proc).execute(`call-${n++}`, full);
      return { ok: true, result: r };
    } catch (e) {
      return { ok: false, error: String(e?.message ?? e) };
    }
  };
  return { barrel, call, exec, proc };
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** Text of a tool result's first content item. */
export function textOf(r) {
  return r?.result?.content?.map((c) => c.text ?? "").join("") ?? "";
}
