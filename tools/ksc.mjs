#!/usr/bin/env node
// Compile .ksy files with the pinned kaitai-struct-compiler from npm (see package.json).
//
//   node tools/ksc.mjs [-t LANG]... [-d OUTDIR] [--allow-warnings] FILE.ksy...
//   npm run ksc -- -t python -d out generated/kaitai/pgoutput_capture.ksy
//
// The npm build of the compiler is a library: compile(lang, ksyObject, importer, debug)
// resolves to {fileName: source}. It throws on errors but silently drops warnings (the JVM
// command line prints them), so this script hooks the compiler's precompile step to collect
// every problem it reports and prints them the way the JVM compiler does. Any warning makes
// the exit status 1 unless --allow-warnings is given; errors always do.
// Imports are resolved relative to the importing .ksy file, as the JVM compiler does.
// Without -t, the files are only checked (compiled to python in memory, nothing written).

import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";

const require = createRequire(import.meta.url);
const yaml = require("js-yaml");

// The stock module, evaluated once more with a hook that records the precompile problems.
const HOOK_ANCHOR = "MainJs = $m_Lio_kaitai_struct_MainJs$();";
const PRECOMPILE = "precompile__Lio_kaitai_struct_format_ClassSpecs__Lio_kaitai_struct_RuntimeConfig__sc_Iterable";
const HOOK = `
{
  const proto = $c_Lio_kaitai_struct_Main$.prototype;
  const original = proto.${PRECOMPILE};
  if (typeof original !== "function") throw new Error("ksc.mjs: compiler internals changed, update the hook");
  proto.${PRECOMPILE} = function (specs, config) {
    const problems = original.call(this, specs, config);
    const it = problems.iterator__sc_Iterator();
    while (it.hasNext__Z()) {
      const p = it.next__O();
      globalThis.__kscProblems.push({
        severity: p.severity__Lio_kaitai_struct_problems_ProblemSeverity().message__T(),
        message: p.message__T().trimEnd(),
      });
    }
    return problems;
  };
}
`;

function loadCompiler() {
  const file = require.resolve("kaitai-struct-compiler");
  const source = fs.readFileSync(file, "utf8");
  if (!source.includes(HOOK_ANCHOR)) {
    throw new Error(`ksc.mjs: ${file} has no '${HOOK_ANCHOR}'; the compiler version changed`);
  }
  const patched = source.replace(HOOK_ANCHOR, HOOK + HOOK_ANCHOR);
  const module = { exports: {} };
  new Function("module", "exports", "define", patched)(module, module.exports, undefined);
  return module.exports;
}

function readKsy(file) {
  return yaml.load(fs.readFileSync(file, "utf8"), { filename: file });
}

function importerFor(mainFile) {
  const base = path.dirname(path.resolve(mainFile));
  return {
    importYaml(name, mode) {
      const candidate = path.isAbsolute(name) ? name : path.join(base, name);
      const file = candidate.endsWith(".ksy") ? candidate : candidate + ".ksy";
      return Promise.resolve(readKsy(file));
    },
  };
}

// Scala.js wraps compiler failures ("Boxed Exception"); report the innermost cause.
function describe(err) {
  let e = err;
  for (let i = 0; i < 10 && e; i++) {
    const cause = typeof e.getCause__jl_Throwable === "function"
      ? e.getCause__jl_Throwable() : e.jl_Throwable__f_e;
    if (!cause || cause === e) break;
    e = cause;
  }
  if (e && typeof e.getMessage__T === "function") {
    const name = e.$classData ? e.$classData.name : "error";
    return `${name}: ${e.getMessage__T()}`;
  }
  return String(e);
}

function usage(msg) {
  if (msg) console.error(`ksc.mjs: ${msg}`);
  console.error("usage: node tools/ksc.mjs [-t LANG]... [-d OUTDIR] [--allow-warnings] FILE.ksy...");
  process.exit(2);
}

async function main(argv) {
  const langs = [];
  const files = [];
  let outDir = null;
  let allowWarnings = false;
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === "-t" || a === "--target") langs.push(argv[++i] ?? usage("-t needs a language"));
    else if (a === "-d" || a === "--outdir") outDir = argv[++i] ?? usage("-d needs a folder");
    else if (a === "--allow-warnings") allowWarnings = true;
    else if (a === "-h" || a === "--help") usage();
    else if (a.startsWith("-")) usage(`unknown option ${a}`);
    else files.push(a);
  }
  if (!files.length) usage("no .ksy file given");

  const ksc = loadCompiler();
  const write = langs.length > 0;
  if (!write) langs.push("python");
  for (const lang of langs) {
    if (!ksc.languages.includes(lang)) usage(`unknown language ${lang} (have: ${ksc.languages.join(", ")})`);
  }
  let failed = false;
  let warned = false;
  for (const file of files) {
    for (const lang of langs) {
      globalThis.__kscProblems = [];
      let result;
      try {
        result = await ksc.compile(lang, readKsy(file), importerFor(file), false);
      } catch (err) {
        console.error(`${file}: error (${lang}): ${describe(err)}`);
        failed = true;
        continue;
      }
      // Problems repeat once per language; report them with the first one only.
      const seen = new Set();
      for (const p of globalThis.__kscProblems) {
        if (seen.has(p.message)) continue;
        seen.add(p.message);
        console.error(`${file}: ${p.message}`);
        if (p.severity === "warning") warned = true;
        else failed = true;
      }
      if (!write) continue;
      const dir = path.join(outDir ?? ".", lang);
      for (const [name, text] of Object.entries(result)) {
        const dest = path.join(dir, name);
        fs.mkdirSync(path.dirname(dest), { recursive: true });
        fs.writeFileSync(dest, text);
        console.log(dest);
      }
    }
  }
  if (failed || (warned && !allowWarnings)) process.exit(1);
}

main(process.argv.slice(2)).catch((err) => {
  console.error(err && err.stack ? err.stack : String(err));
  process.exit(1);
});
