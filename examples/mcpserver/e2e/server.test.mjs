// End-to-end test of the bgjob MCP server, driven by the official
// TypeScript MCP SDK client over stdio, under Node's own test runner.
//
// It spawns the built server binary (MCPSERVER_BIN, default ../mcpserver
// relative to this file; ci.sh builds it) as a real client would.

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, mkdirSync, readFileSync, realpathSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { createConnection, createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { LoggingMessageNotificationSchema } from '@modelcontextprotocol/sdk/types.js';

const here = dirname(fileURLToPath(import.meta.url));
const bin = process.env.MCPSERVER_BIN ? resolve(process.env.MCPSERVER_BIN) : resolve(here, '..', 'mcpserver');

// Every wait on an event is bounded by this.
const DEADLINE_MS = 20_000;

let tmp; // a scratch directory: the jail and a place outside it
let jail;

before(() => {
  assert.ok(existsSync(bin), `server binary ${bin} not found: build it first (go build -o mcpserver .)`);
  tmp = realpathSync(mkdtempSync(join(tmpdir(), 'bgjob-mcp-e2e-')));
  jail = join(tmp, 'jail');
  mkdirSync(join(jail, 'sub'), { recursive: true });
  mkdirSync(join(tmp, 'outside'));
  symlinkSync(join(tmp, 'outside'), join(jail, 'escape'));
});

after(() => {
  rmSync(tmp, { recursive: true, force: true });
});

// start spawns a server process and connects a client to it. Its logging
// notifications from logger "bgjob" are collected in the returned
// `notes`; `completion(id)` waits for a job's job_completed one, and
// `matched(id, n)` for n job_matched ones.
async function start(args = []) {
  const transport = new StdioClientTransport({
    command: bin,
    args: ['-dir', jail, '-progress-interval', '100ms', '-kill-grace', '300ms', ...args],
    stderr: 'inherit',
  });
  const client = new Client({ name: 'bgjob-e2e', version: '0.0.0' });
  const notes = [];
  const waiters = [];
  client.setNotificationHandler(LoggingMessageNotificationSchema, (n) => {
    if (n.params.logger !== 'bgjob') return;
    notes.push(n.params.data);
    for (const w of waiters.splice(0)) w();
  });
  await client.connect(transport);
  await client.setLoggingLevel('info');

  // notifications waits until n notifications of the event about job id
  // came, and returns them.
  const notifications = async (event, id, n) => {
    const until = Date.now() + DEADLINE_MS;
    for (;;) {
      const found = notes.filter((c) => c.event === event && c.job_id === id);
      if (found.length >= n) return found;
      const left = until - Date.now();
      assert.ok(left > 0, `${found.length} ${event} notifications for ${id}; want ${n}`);
      await new Promise((resolve) => {
        const timer = setTimeout(resolve, left);
        waiters.push(() => { clearTimeout(timer); resolve(); });
      });
    }
  };
  const completion = async (id) => (await notifications('job_completed', id, 1))[0];
  const matched = (id, n) => notifications('job_matched', id, n);

  // call returns the tool result; ok asserts it is not a tool error.
  const call = (name, args = {}, options) => client.callTool({ name, arguments: args }, undefined, options);
  const ok = async (name, args, options) => {
    const res = await call(name, args, options);
    assert.ok(!res.isError, `${name}(${JSON.stringify(args)}) failed: ${res.content?.[0]?.text}`);
    assert.ok(res.structuredContent, `${name}: no structured content`);
    return res;
  };
  return { client, call, ok, notes, completion, matched, close: () => client.close() };
}

// readAll follows a job's output with shell_status from offset to the end,
// max bytes at a time; between empty reads it blocks in shell_wait.
async function readAll(s, id, offset, max) {
  const chunks = [];
  const until = Date.now() + DEADLINE_MS;
  for (;;) {
    const st = (await s.ok('shell_status', { job_id: id, offset, max_bytes: max })).structuredContent;
    assert.equal(st.offset, offset, 'chunks are contiguous');
    assert.equal(st.skipped ?? 0, 0);
    chunks.push(st);
    if (st.done) return chunks;
    assert.ok(Date.now() < until, `job ${id} did not end in time`);
    if (st.next_offset === offset) {
      await s.ok('shell_wait', { job_id: id, timeout_ms: 200 });
    }
    offset = st.next_offset;
  }
}

function gone(pid) {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2)[0] === 'Z'; // a zombie holds nothing
  } catch {
    try {
      process.kill(pid, 0);
      return false;
    } catch (e) {
      return e.code === 'ESRCH';
    }
  }
}

test('lists the seven tools with input and output schemas', async () => {
  const s = await start();
  try {
    const { tools } = await s.client.listTools();
    const names = tools.map((t) => t.name).sort();
    assert.deepEqual(names, ['shell', 'shell_cancel', 'shell_list', 'shell_status', 'shell_wait', 'shell_watch', 'shell_write']);
    for (const t of tools) {
      assert.equal(t.inputSchema.type, 'object', `${t.name} input schema`);
      assert.equal(t.outputSchema?.type, 'object', `${t.name} output schema`);
    }
    const shell = tools.find((t) => t.name === 'shell');
    assert.deepEqual(shell.inputSchema.required, ['command']);
    for (const p of ['command', 'cwd', 'timeout_ms', 'idle_timeout_ms', 'wait_ms', 'background', 'stdin', 'interactive', 'tty', 'rows', 'cols', 'leftovers', 'priority', 'until']) {
      assert.ok(p in shell.inputSchema.properties, `shell input has ${p}`);
    }
  } finally {
    await s.close();
  }
});

test('runs a command inline and returns its output and exit code', async () => {
  const s = await start();
  try {
    const res = await s.ok('shell', { command: 'echo hello; echo oops >&2; cat; exit 7', stdin: 'in\n' });
    const out = res.structuredContent;
    assert.equal(out.detached, false);
    assert.equal(out.job_id, undefined);
    assert.equal(out.state, 'exited');
    assert.equal(out.exit_code, 7);
    assert.equal(out.output, 'hello\noops\nin\n');
    assert.equal(out.output_bytes, 14);
    assert.match(res.content[0].text, /^exited, exit code 7/);
    // The default cwd is the jail.
    const pwd = (await s.ok('shell', { command: 'pwd -P' })).structuredContent;
    assert.equal(pwd.output, jail + '\n');
  } finally {
    await s.close();
  }
});

test('detaches a long command and reads it incrementally to the end', async () => {
  const s = await start();
  try {
    const progress = [];
    const cmd = 'i=0; while [ $i -lt 8 ]; do echo step$i; i=$((i+1)); sleep 0.1; done';
    const res = await s.ok('shell', { command: cmd, wait_ms: 350 }, { onprogress: (p) => progress.push(p) });
    const out = res.structuredContent;
    assert.equal(out.detached, true);
    assert.match(out.job_id, /^job_[0-9a-f]{16}$/);
    assert.equal(out.state, 'running');
    assert.equal(out.exit_code, undefined);
    assert.ok(progress.length >= 1, 'progress notifications while waiting');
    assert.ok(progress.every((p, i) => i === 0 || p.progress > progress[i - 1].progress), 'progress increases');

    // Read on from where the shell call stopped, one 6-byte line at a time.
    const chunks = await readAll(s, out.job_id, out.next_offset, 6);
    const all = out.output + chunks.map((c) => c.output).join('');
    assert.equal(all, [0, 1, 2, 3, 4, 5, 6, 7].map((i) => `step${i}\n`).join(''));
    assert.ok(chunks.filter((c) => c.output !== '').length >= 2, 'read in several chunks');
    const last = chunks.at(-1);
    assert.equal(last.state, 'exited');
    assert.equal(last.exit_code, 0);
    assert.equal(last.next_offset, 48);

    const done = await s.completion(out.job_id);
    assert.equal(done.event, 'job_completed');
    assert.equal(done.state, 'exited');
    assert.equal(done.exit_code, 0);

    const list = (await s.ok('shell_list')).structuredContent;
    assert.deepEqual(list.jobs.map((j) => [j.job_id, j.state]), [[out.job_id, 'exited']]);
  } finally {
    await s.close();
  }
});

test('cancels a whole process tree', async () => {
  const s = await start();
  try {
    // A grandchild that ignores SIGTERM: only the group SIGKILL stops it.
    const cmd = `sh -c 'trap "" TERM; echo grandchild $$; exec sleep 300' & wait`;
    const { job_id: id } = (await s.ok('shell', { command: cmd, background: true })).structuredContent;
    let pid = 0;
    const until = Date.now() + DEADLINE_MS;
    while (!pid) {
      const st = (await s.ok('shell_status', { job_id: id })).structuredContent;
      const m = /grandchild (\d+)/.exec(st.output);
      if (m) pid = Number(m[1]);
      else {
        assert.ok(Date.now() < until, 'grandchild reported its PID');
        await s.ok('shell_wait', { job_id: id, timeout_ms: 100 });
      }
    }
    assert.equal(gone(pid), false, 'grandchild runs before cancel');

    const c1 = (await s.ok('shell_cancel', { job_id: id })).structuredContent;
    assert.equal(c1.state, 'cancelled');
    assert.equal(c1.exit_code, 130);
    assert.equal(c1.done, true);
    assert.equal(gone(pid), true, `grandchild ${pid} stopped`);

    const c2 = (await s.ok('shell_cancel', { job_id: id })).structuredContent; // idempotent
    assert.deepEqual([c2.state, c2.exit_code, c2.duration_ms], [c1.state, c1.exit_code, c1.duration_ms]);
    assert.equal((await s.completion(id)).state, 'cancelled');

    const unknown = await s.call('shell_cancel', { job_id: 'job_0123456789abcdef' });
    assert.equal(unknown.isError, true, 'an unknown ID is a tool error');
  } finally {
    await s.close();
  }
});

test('refuses a cwd outside the -dir jail', async () => {
  const s = await start();
  try {
    for (const cwd of ['/', join(tmp, 'outside'), '..', 'escape']) {
      const res = await s.call('shell', { command: 'pwd', cwd });
      assert.equal(res.isError, true, `cwd ${cwd} refused`);
      assert.match(res.content[0].text, /refused/);
    }
    const sub = (await s.ok('shell', { command: 'pwd -P', cwd: 'sub' })).structuredContent;
    assert.equal(sub.output, join(jail, 'sub') + '\n');
  } finally {
    await s.close();
  }
});

test('two clients cannot see each other\'s jobs', async () => {
  const a = await start();
  const b = await start();
  try {
    const { job_id: id } = (await a.ok('shell', { command: 'sleep 60', background: true })).structuredContent;
    for (const tool of ['shell_status', 'shell_wait', 'shell_cancel']) {
      const res = await b.call(tool, { job_id: id });
      assert.equal(res.isError, true, `b's ${tool} of a's job`);
      assert.match(res.content[0].text, /no job/);
    }
    assert.deepEqual((await b.ok('shell_list')).structuredContent.jobs, []);
    assert.equal((await a.ok('shell_status', { job_id: id })).structuredContent.state, 'running');
    assert.equal((await a.ok('shell_cancel', { job_id: id })).structuredContent.state, 'cancelled');
  } finally {
    await a.close();
    await b.close();
  }
});

test('shell_list shows a dev server\'s processes and port; cancel frees the port', async () => {
  const s = await start();
  try {
    // A dev server its shell starts in the background (node, which this
    // test runs on, as the server), kept running with leftovers: "wait".
    const server = `${JSON.stringify(process.execPath)} -e "require('net').createServer().listen(0, '127.0.0.1', function () { console.log('port ' + this.address().port) })"`;
    const res = await s.ok('shell', { command: `${server} & echo started`, background: true, leftovers: 'wait' });
    const id = res.structuredContent.job_id;
    let port = 0;
    const until = Date.now() + DEADLINE_MS;
    while (!port) {
      const st = (await s.ok('shell_status', { job_id: id })).structuredContent;
      const m = /port (\d+)/.exec(st.output);
      if (m) port = Number(m[1]);
      else {
        assert.ok(Date.now() < until && !st.done, `the server said its port: ${JSON.stringify(st)}`);
        await s.ok('shell_wait', { job_id: id, timeout_ms: 100 });
      }
    }
    const list = await s.ok('shell_list');
    const job = list.structuredContent.jobs.find((j) => j.job_id === id);
    assert.equal(job.state, 'running', 'the job runs as long as its server');
    assert.deepEqual(job.ports, [port]);
    assert.ok(job.processes.some((p) => p.command.includes('createServer')), `the server among ${JSON.stringify(job.processes)}`);
    assert.match(list.content[0].text, new RegExp(`listening on port ${port}`));

    assert.equal((await s.ok('shell_cancel', { job_id: id })).structuredContent.state, 'cancelled');
    await assert.rejects(new Promise((resolve, reject) => {
      const c = createConnection(port, '127.0.0.1', () => { c.end(); resolve(); });
      c.on('error', reject);
    }), /ECONNREFUSED/, 'the port is free after cancel');
  } finally {
    await s.close();
  }
});

test('-queue: a command beyond -max-running waits, queued, and runs when a slot frees', async () => {
  const s = await start(['-max-running', '1', '-queue']);
  try {
    const { job_id: first } = (await s.ok('shell', { command: 'sleep 60', background: true })).structuredContent;
    const q = (await s.ok('shell', { command: 'echo my turn', wait_ms: 200 })).structuredContent;
    assert.equal(q.detached, true);
    assert.equal(q.state, 'queued');
    assert.equal(q.queue_position, 1);
    const list = (await s.ok('shell_list')).structuredContent;
    assert.deepEqual(list.jobs.map((j) => [j.state, j.queue_position]), [['running', undefined], ['queued', 1]]);
    await s.ok('shell_cancel', { job_id: first });
    const w = (await s.ok('shell_wait', { job_id: q.job_id, timeout_ms: DEADLINE_MS })).structuredContent;
    assert.equal(w.state, 'exited');
    assert.equal(w.output, 'my turn\n');
  } finally {
    await s.close();
  }
});

test('-state-dir: a background job survives a restart of the server', async () => {
  const state = join(tmp, 'state');
  const first = await start(['-state-dir', state]);
  let id;
  try {
    const res = await first.ok('shell', { command: 'sleep 1; echo survived', background: true });
    id = res.structuredContent.job_id;
    assert.equal(res.structuredContent.state, 'running');
  } finally {
    await first.close(); // the server exits and lets the job go on
  }
  const second = await start(['-state-dir', state]);
  try {
    const w = (await second.ok('shell_wait', { job_id: id, timeout_ms: DEADLINE_MS })).structuredContent;
    assert.equal(w.state, 'exited');
    assert.equal(w.exit_code, 0);
    const st = (await second.ok('shell_status', { job_id: id })).structuredContent;
    assert.equal(st.output, 'survived\n');
    assert.equal(st.done, true);
  } finally {
    await second.close();
  }
});

test('shell with until returns the ready line and leaves the server running', async () => {
  const s = await start();
  try {
    const begin = Date.now();
    const res = await s.ok('shell', {
      command: 'echo booting; sleep 0.3; echo "Local: http://localhost:5173/ ready in 312 ms"; sleep 60',
      until: 'ready in \\d+ ms',
      wait_ms: 20_000,
    });
    const out = res.structuredContent;
    assert.ok(Date.now() - begin < 10_000, 'returned as soon as the line came, not at wait_ms');
    assert.equal(out.detached, true);
    assert.equal(out.state, 'running');
    assert.deepEqual(out.matched, { line: 'Local: http://localhost:5173/ ready in 312 ms', offset: 8 });
    assert.match(res.content[0].text, /until matched at offset 8/);
    assert.equal((await s.ok('shell_status', { job_id: out.job_id })).structuredContent.state, 'running');

    // shell_wait with until: the line was printed before the call.
    const w = (await s.ok('shell_wait', { job_id: out.job_id, until: '^booting$' })).structuredContent;
    assert.equal(w.done, false);
    assert.deepEqual(w.matched, { line: 'booting', offset: 0 });
    assert.equal((await s.ok('shell_cancel', { job_id: out.job_id })).structuredContent.state, 'cancelled');

    // A command that ends before the line: its final result.
    const done = (await s.ok('shell', { command: 'echo build failed; exit 2', until: 'ready' })).structuredContent;
    assert.equal(done.detached, false);
    assert.equal(done.exit_code, 2);
    assert.equal(done.matched, undefined);
  } finally {
    await s.close();
  }
});

// awaitScreen calls shell_status until the job's screen satisfies ok (the
// screen follows the job's output, which comes when it comes), or fails
// at the deadline; between calls it blocks in shell_wait, not in a sleep.
async function awaitScreen(s, id, ok, what) {
  const until = Date.now() + DEADLINE_MS;
  for (;;) {
    const st = (await s.ok('shell_status', { job_id: id })).structuredContent;
    assert.ok(st.screen, 'a tty job\'s status has its screen');
    if (ok(st.screen.rows)) return st;
    assert.ok(Date.now() < until, `screen never showed ${what}: ${JSON.stringify(st.screen.rows)}`);
    assert.ok(!st.done, `job ended before its screen showed ${what}`);
    await s.ok('shell_wait', { job_id: id, timeout_ms: 100 });
  }
}

test('answers a prompt with shell_write (read, then echo)', async () => {
  const s = await start();
  try {
    const cmd = 'printf "name? "; read name; echo "hello, $name"; read more; echo "and $more"';
    const out = (await s.ok('shell', { command: cmd, interactive: true })).structuredContent;
    assert.equal(out.detached, true);
    assert.equal(out.interactive, true);
    assert.equal(out.output, 'name? ');
    const w = (await s.ok('shell_write', { job_id: out.job_id, text: 'ada', keys: ['enter'] })).structuredContent;
    assert.equal(w.written, 4);
    assert.equal(w.output, 'hello, ada\n');
    assert.equal(w.state, 'running');
    const end = (await s.ok('shell_write', { job_id: out.job_id, text: 'more\n', eof: true })).structuredContent;
    assert.equal(end.output, 'and more\n');
    const done = (await s.ok('shell_wait', { job_id: out.job_id })).structuredContent;
    assert.equal(done.state, 'exited');
    assert.equal(done.exit_code, 0);
    assert.equal(done.output, 'name? hello, ada\nand more\n');
    const late = await s.call('shell_write', { job_id: out.job_id, text: 'x' });
    assert.ok(late.isError, 'writing to an ended job is a tool error');
    assert.match(late.content[0].text, /input is closed/);
  } finally {
    await s.close();
  }
});

test('shell_watch pushes each matching line as a notification', async () => {
  const s = await start();
  try {
    const gate = join(tmp, 'gate');
    const cmd = `echo start; while [ ! -e ${gate} ]; do sleep 0.01; done; echo "GET / 200"; echo "GET /x 500 error"; echo "GET /y 500 error"; sleep 60`;
    const { job_id: id } = (await s.ok('shell', { command: cmd, background: true })).structuredContent;
    const wo = (await s.ok('shell_watch', { job_id: id, pattern: ' 5\\d\\d ', name: 'server-errors', every: true })).structuredContent;
    assert.deepEqual(wo, { job_id: id, name: 'server-errors', pattern: ' 5\\d\\d ', every: true });
    const dup = await s.call('shell_watch', { job_id: id, pattern: 'x', name: 'server-errors' });
    assert.equal(dup.isError, true, 'a name taken is a tool error');
    writeFileSync(gate, '');
    const ms = await s.matched(id, 2);
    assert.deepEqual(ms.map((m) => [m.watch, m.line, m.offset]), [
      ['server-errors', 'GET /x 500 error', 16],
      ['server-errors', 'GET /y 500 error', 33],
    ]);
    assert.ok(ms.every((m) => typeof m.at === 'string' && m.session), 'a match carries its time and session');
    await s.ok('shell_cancel', { job_id: id });
    const late = await s.call('shell_watch', { job_id: id, pattern: 'x' });
    assert.equal(late.isError, true, 'an ended job cannot be watched');
  } finally {
    await s.close();
  }
});

test('drives a REPL (bc) in a terminal', async () => {
  const s = await start();
  try {
    const out = (await s.ok('shell', { command: 'bc -q', tty: true, rows: 12, cols: 60 })).structuredContent;
    assert.equal(out.detached, true);
    assert.equal(out.screen.rows.length, 12);
    let w = (await s.ok('shell_write', { job_id: out.job_id, text: '2^10', keys: ['enter'] })).structuredContent;
    if (!w.screen.rows.includes('1024')) {
      await awaitScreen(s, out.job_id, (rows) => rows.includes('1024'), '1024');
    }
    w = (await s.ok('shell_write', { job_id: out.job_id, text: 'scale=3; 10/4\n' })).structuredContent;
    const st = await awaitScreen(s, out.job_id, (rows) => rows.includes('2.500'), '2.500');
    // What was typed is echoed by the terminal, each answer on its line.
    const rows = st.screen.rows;
    assert.deepEqual(rows.slice(0, 4), ['2^10', '1024', 'scale=3; 10/4', '2.500']);
    // Ctrl-D at the start of a line: bc reads end of file and exits.
    await s.ok('shell_write', { job_id: out.job_id, eof: true });
    const done = (await s.ok('shell_wait', { job_id: out.job_id })).structuredContent;
    assert.equal(done.state, 'exited');
    assert.equal(done.exit_code, 0);
    assert.match(done.output, /2\^10\n1024\n/, 'the text of a tty job is its stream without escape sequences, \\r\\n as \\n');
  } finally {
    await s.close();
  }
});

test('interrupts a sleep in a terminal with ctrl-c', async () => {
  const s = await start();
  try {
    const out = (await s.ok('shell', { command: 'sleep 100', tty: true, wait_ms: 100 })).structuredContent;
    assert.equal(out.state, 'running');
    // As a person would: press ctrl-c until it takes (the shell may still
    // be starting sleep at the first press, and a shell starting a
    // program holds an interrupt back).
    let done;
    for (let i = 0; i < 20 && !done?.done; i++) {
      await s.ok('shell_write', { job_id: out.job_id, keys: ['ctrl-c'], wait_ms: 50 });
      done = (await s.ok('shell_wait', { job_id: out.job_id, timeout_ms: 1000 })).structuredContent;
    }
    assert.equal(done.state, 'exited');
    assert.equal(done.exit_code, 130, 'killed by SIGINT, as a shell reports it');
    assert.ok(done.duration_ms < 30_000);
  } finally {
    await s.close();
  }
});

test('shows a full-screen program\'s redraws', async () => {
  const s = await start();
  try {
    // Clears the screen, then redraws a header, a counter at row 5 and a
    // footer at the bottom at each key, as full-screen programs do.
    const cmd = `printf '\\033[?1049h'; i=1; while [ $i -le 3 ]; do ` +
      `printf '\\033[2J\\033[HFRAME %s of 3\\033[5;10Hcount=%s\\033[10;1Hpress enter' $i $((i*i)); read _; i=$((i+1)); done; ` +
      `printf '\\033[?1049l'; echo bye`;
    const out = (await s.ok('shell', { command: cmd, tty: true, rows: 10, cols: 40 })).structuredContent;
    let st = await awaitScreen(s, out.job_id, (rows) => rows[0] === 'FRAME 1 of 3', 'frame 1');
    assert.equal(st.screen.rows[4], '         count=1');
    assert.equal(st.screen.rows[9], 'press enter');
    await s.ok('shell_write', { job_id: out.job_id, keys: ['enter'] });
    st = await awaitScreen(s, out.job_id, (rows) => rows[0] === 'FRAME 2 of 3', 'frame 2');
    assert.equal(st.screen.rows[4], '         count=4');
    assert.deepEqual(st.screen.rows.filter((r) => r !== ''), ['FRAME 2 of 3', '         count=4', 'press enter'], 'the old frame is gone');
    assert.equal(st.screen.cursor_row, 9);
    await s.ok('shell_write', { job_id: out.job_id, keys: ['enter'] });
    await awaitScreen(s, out.job_id, (rows) => rows[4] === '         count=9', 'frame 3');
    await s.ok('shell_write', { job_id: out.job_id, keys: ['enter'] });
    const done = (await s.ok('shell_wait', { job_id: out.job_id })).structuredContent;
    assert.equal(done.state, 'exited');
    assert.match(done.output, /bye\n$/);
  } finally {
    await s.close();
  }
});

test('-sandbox: a write outside the jail and a network connection fail, and work without it', async (t) => {
  // A server on the host's loopback for the job to reach.
  const server = createServer((c) => c.end('hello\n'));
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address();
  const outside = join(tmp, 'outside', 'written');
  const write = { command: `echo x > ${outside}` };
  const connect = { command: `bash -c 'exec 3<>/dev/tcp/127.0.0.1/${port} && head -n1 <&3'` };
  const inside = { command: 'echo kept > in-jail && cat in-jail' };
  try {
    const off = await start();
    try {
      assert.equal((await off.ok('shell', write)).structuredContent.exit_code, 0);
      assert.ok(existsSync(outside), 'without the sandbox the write lands');
      rmSync(outside);
      assert.equal((await off.ok('shell', connect)).structuredContent.output, 'hello\n');
    } finally {
      await off.close();
    }
    const on = await start(['-sandbox']);
    try {
      const w = (await on.ok('shell', write)).structuredContent;
      assert.notEqual(w.exit_code, 0, `sandboxed write outside the jail: ${w.output}`);
      assert.ok(!existsSync(outside), 'the sandboxed write must not reach the host');
      const c = (await on.ok('shell', connect)).structuredContent;
      assert.notEqual(c.exit_code, 0, `sandboxed connection: ${c.output}`);
      assert.doesNotMatch(c.output, /hello/);
      const i = (await on.ok('shell', inside)).structuredContent;
      assert.equal(i.output, 'kept\n', 'the jail stays writable');
    } finally {
      await on.close();
    }
  } finally {
    server.close();
  }
});
