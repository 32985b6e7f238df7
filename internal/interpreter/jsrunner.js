// The evaluator behind the JavaScript and TypeScript kernel (jskernel.py):
// one Node.js process per context, which runs each cell in its one global
// scope, so that what a cell declares is there for the next, as in a
// notebook.
//
// Protocol (jskernel.py): a cell is one JSON line on the fd argv[4],
// {"code": "..."}; its console output goes to stdout and stderr as it
// comes (both synchronous for pipes on Linux: Node's "process I/O"
// docs), then its outcome is one JSON line on the fd argv[5] ({"mime": {...}} for
// a value, {"error": {...}} for a throw, {} for nothing), then a marker
// (argv[2]) ends stdout and stderr. A SIGINT ends the cell running: its
// synchronous part through vm's breakOnSigint, its awaiting part here.
//
// A cell is rewritten before it runs, as Node's REPL does for top-level
// await (lib/internal/repl/await.js): its body runs in an async function,
// so await works at the top; its top-level declarations become globals
// (var, let, const, class, function, import), so they outlive the cell
// and may be declared again; its last expression statement is its value.
// Imports become require() of the same module from the working directory
// (as E2B's kernel turns ESM into CommonJS), and the module's namespace
// by import() where require() cannot load it (a package published as ESM
// only); a cell's import() resolves from the working directory too (the
// kernel runs Node.js with --experimental-vm-modules, without which vm
// code has no import(), and --experimental-import-meta-resolve, for
// import.meta.resolve's parent argument: Node 18). TypeScript's types are
// stripped, not checked (TypeScript's transpileModule, as Babel's preset
// does for E2B's kernel). The parser is TypeScript's (Debian's
// node-typescript), loaded at the first cell: a context that runs no
// JavaScript costs only a bare Node.js.
'use strict';

const fs = require('fs');
const path = require('path');
const util = require('util');
const vm = require('vm');
const { createRequire, isBuiltin } = require('module');
const { pathToFileURL } = require('url');

const mark = process.argv[2];
const typescriptLanguage = process.argv[3] === 'typescript';
const cellsFd = Number(process.argv[4]);
const outcomesFd = Number(process.argv[5]);

let ts;
function typescript() {
  if (!ts) {
    try {
      ts = require('typescript');
    } catch (e) {
      // Debian's nodejs looks in /usr/share/nodejs itself; another
      // Node.js (NodeSource's, on a host) does not.
      ts = require('/usr/share/nodejs/typescript');
    }
  }
  return ts;
}

// rewrite is the cell as a script of one async call (see the top).
function rewrite(code) {
  const t = typescript();
  const kind = typescriptLanguage ? t.ScriptKind.TS : t.ScriptKind.JS;
  const sf = t.createSourceFile(typescriptLanguage ? 'cell.ts' : 'cell.js', code, t.ScriptTarget.Latest, true, kind);
  if (sf.parseDiagnostics.length > 0) {
    const d = sf.parseDiagnostics[0];
    const { line, character } = sf.getLineAndCharacterOfPosition(d.start);
    const err = new SyntaxError(`${t.flattenDiagnosticMessageText(d.messageText, '\n')} (${line + 1}:${character + 1})`);
    err.stack = `SyntaxError: ${err.message}`;
    throw err;
  }
  const names = new Set();
  const hoisted = [];
  const edits = [];
  const text = (n) => code.slice(n.getStart(sf), n.end);
  // A declaration's text without some of its modifiers: `export` (a cell
  // is no module), and what a class expression cannot have.
  const textWithout = (n, kinds) => {
    let out = '';
    let pos = n.getStart(sf);
    for (const m of n.modifiers || []) {
      if (kinds.includes(m.kind)) {
        out += code.slice(pos, m.getStart(sf));
        pos = m.end;
      }
    }
    return (out + code.slice(pos, n.end)).trim();
  };
  const { ExportKeyword, DefaultKeyword, AbstractKeyword } = t.SyntaxKind;
  sf.statements.forEach((s, i) => {
    const replace = (to) => edits.push({ start: s.getStart(sf), end: s.end, to });
    if (t.isImportDeclaration(s)) {
      replace(importText(t, s, names));
    } else if (t.isVariableStatement(s) && !hasModifier(t, s, t.SyntaxKind.DeclareKeyword)) {
      const isVar = !(s.declarationList.flags & (t.NodeFlags.Let | t.NodeFlags.Const));
      const parts = [];
      for (const d of s.declarationList.declarations) {
        bindingNames(t, d.name, names);
        if (d.initializer) {
          parts.push(`(${text(d.name)} = ${text(d.initializer)})`);
        } else if (!isVar && t.isIdentifier(d.name)) {
          parts.push(`(${d.name.text} = undefined)`);
        }
      }
      replace(parts.length > 0 ? `void (${parts.join(', ')});` : ';');
    } else if (t.isClassDeclaration(s) && s.name && !hasModifier(t, s, t.SyntaxKind.DeclareKeyword)) {
      names.add(s.name.text);
      replace(`${s.name.text} = ${textWithout(s, [ExportKeyword, DefaultKeyword, AbstractKeyword])};`);
    } else if (t.isFunctionDeclaration(s) && s.name && s.body) {
      // Left a declaration (hoisted within the cell), and made global
      // before the cell's first statement runs.
      replace(textWithout(s, [ExportKeyword, DefaultKeyword]));
      hoisted.push(`globalThis[${JSON.stringify(s.name.text)}] = ${s.name.text};`);
    } else if (t.isEnumDeclaration(s) && !hasModifier(t, s, t.SyntaxKind.DeclareKeyword) &&
               !hasModifier(t, s, t.SyntaxKind.ConstKeyword)) {
      // TypeScript makes an enum a var of the cell's function: made
      // global once it is set.
      replace(`${textWithout(s, [ExportKeyword])}\nglobalThis[${JSON.stringify(s.name.text)}] = ${s.name.text};`);
    } else if (i === sf.statements.length - 1 && t.isExpressionStatement(s)) {
      replace(`return (${text(s.expression)});`);
    }
  });
  let body = code;
  for (const e of edits.sort((a, b) => b.start - a.start)) {
    body = body.slice(0, e.start) + e.to + body.slice(e.end);
  }
  // One line before the cell's first, so its line numbers are off by one
  // only (lineOffset puts them back).
  let script = `${names.size > 0 ? `var ${[...names].join(', ')}; ` : ''}(async () => { ${hoisted.join(' ')}\n${body}\n})()`;
  if (typescriptLanguage) {
    // ESNext leaves import() as it is (the cell's declarations are
    // rewritten above, so there is nothing else of modules left); with
    // None TypeScript made it require(), which loads no ES module.
    script = t.transpileModule(script, {
      compilerOptions: { target: t.ScriptTarget.ES2022, module: t.ModuleKind.ESNext, removeComments: false },
    }).outputText;
  }
  // Sloppy mode, as a notebook's cell is: `x = 1` makes a global.
  return script.replace(/^"use strict";\s*/, '');
}

function hasModifier(t, node, kind) {
  return (node.modifiers || []).some((m) => m.kind === kind);
}

// bindingNames adds the names a declaration's binding introduces.
function bindingNames(t, name, names) {
  if (t.isIdentifier(name)) {
    names.add(name.text);
    return;
  }
  for (const el of name.elements) {
    if (!t.isOmittedExpression(el)) {
      bindingNames(t, el.name, names);
    }
  }
}

// importText is an import declaration as assignments from its module
// (__sandstorm.load): `import d, {a as b} from "m"` sets d (the module's
// default, or the module itself when it is CommonJS) and b. Type-only
// imports go.
function importText(t, s, names) {
  const from = `(await __sandstorm.load(${JSON.stringify(s.moduleSpecifier.text)}))`;
  const c = s.importClause;
  if (!c) {
    return `${from};`;
  }
  if (c.isTypeOnly) {
    return ';';
  }
  const parts = [];
  if (c.name) {
    names.add(c.name.text);
    parts.push(`(${c.name.text} = __sandstorm.interopDefault(${from}))`);
  }
  const b = c.namedBindings;
  if (b && t.isNamespaceImport(b)) {
    names.add(b.name.text);
    parts.push(`(${b.name.text} = ${from})`);
  } else if (b) {
    const props = [];
    for (const el of b.elements) {
      if (el.isTypeOnly) {
        continue;
      }
      names.add(el.name.text);
      props.push(el.propertyName ? `${JSON.stringify(el.propertyName.text)}: ${el.name.text}` : el.name.text);
    }
    if (props.length > 0) {
      parts.push(`({${props.join(', ')}} = ${from})`);
    }
  }
  return parts.length > 0 ? `void (${parts.join(', ')});` : ';';
}

// mimeOf is a value's display formats, as E2B's kernel (nel) makes them:
// text/plain is util.inspect's, and an object may give others by its
// _toHtml, _toSvg, _toPng and _toJpeg methods, or all by _toMime.
function mimeOf(v) {
  if (v === undefined) {
    return null;
  }
  let m = {};
  if (v !== null && typeof v._toMime === 'function') {
    try {
      m = Object.assign({}, v._toMime());
    } catch (e) { /* the defaults below */ }
  }
  if (!('text/plain' in m)) {
    m['text/plain'] = util.inspect(v);
  }
  for (const [method, type] of [['_toHtml', 'text/html'], ['_toSvg', 'image/svg+xml'], ['_toPng', 'image/png'], ['_toJpeg', 'image/jpeg']]) {
    if (v !== null && typeof v[method] === 'function' && !(type in m)) {
      try {
        m[type] = v[method]();
      } catch (e) { /* left out */ }
    }
  }
  return m;
}

function errorOf(e) {
  if (e instanceof Error || (e && typeof e === 'object' && 'message' in e)) {
    return { ename: String(e.name || 'Error'), evalue: String(e.message), traceback: String(e.stack || '').split('\n') };
  }
  return { ename: 'Error', evalue: util.inspect(e), traceback: [] };
}

// importFromCwd is import(spec) as a module in the working directory
// would make it: a bare name from its node_modules, a relative path from
// it. The resolver is import.meta.resolve with that module as parent,
// which only an ES module has (a data: one: this file is CommonJS).
let metaResolve;
async function importFromCwd(spec) {
  if (!isBuiltin(spec)) {
    if (!metaResolve) {
      metaResolve = (await import('data:text/javascript,export default (s, p) => import.meta.resolve(s, p);')).default;
    }
    spec = await metaResolve(spec, pathToFileURL(path.join(process.cwd(), '[cell]')).href);
  }
  return import(spec);
}

// What require() throws for a module only import() loads.
const esmOnly = new Set(['ERR_REQUIRE_ESM', 'ERR_PACKAGE_PATH_NOT_EXPORTED', 'ERR_REQUIRE_ASYNC_MODULE']);

// interrupted settles when a SIGINT comes while a cell awaits.
let interrupt = () => {};
process.on('SIGINT', () => interrupt());

async function run(code) {
  // require() resolves from the working directory, which a cell may change.
  globalThis.require = createRequire(path.join(process.cwd(), '[cell]'));
  const script = rewrite(code);
  const stopped = new Promise((_, reject) => {
    interrupt = () => reject(Object.assign(new Error('Script execution interrupted.'), { name: 'KeyboardInterrupt' }));
  });
  try {
    const value = vm.runInThisContext(script, {
      filename: 'cell', lineOffset: -1, breakOnSigint: true, importModuleDynamically: importFromCwd,
    });
    return await Promise.race([value, stopped]);
  } finally {
    interrupt = () => {};
  }
}

// reply ends a cell: its outcome, then the markers. An outcome JSON
// cannot hold (a _toMime with a cycle) is an error instead.
function reply(obj) {
  let line;
  try {
    line = JSON.stringify(obj);
  } catch (e) {
    line = JSON.stringify({ error: errorOf(e) });
  }
  fs.writeSync(outcomesFd, line + '\n');
  fs.writeSync(1, `${mark}0\n`);
  fs.writeSync(2, `${mark}0\n`);
}

globalThis.__sandstorm = {
  // load is an import declaration's module: require()'s, as E2B's kernel
  // gives it, else (ESM only) its namespace by import().
  load: async (spec) => {
    try {
      return globalThis.require(spec);
    } catch (e) {
      if (!esmOnly.has(e.code)) {
        throw e;
      }
    }
    return importFromCwd(spec);
  },
  interopDefault: (m) => (m && (m.__esModule || util.types.isModuleNamespaceObject(m)) ? m.default : m),
};

// Cells come one at a time: the kernel sends the next after this one's
// reply.
const lines = require('readline').createInterface({ input: fs.createReadStream(null, { fd: cellsFd }) });
lines.on('line', async (line) => {
  let out;
  try {
    const { code } = JSON.parse(line);
    const mime = mimeOf(await run(code));
    out = mime ? { mime } : {};
  } catch (e) {
    out = { error: errorOf(e) };
  }
  reply(out);
});
lines.on('close', () => process.exit(0));
