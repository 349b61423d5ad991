#!/usr/bin/env node
// A dualloop client in a second language, built only from proto/dualloop/v2/controller.proto
// (loaded at run time: no generated code). CI runs it against a live server; it checks what an
// integrator relies on and exits non-zero on any failure.
//
//   node check.mjs HOST:PORT [--window BYTES] [--wall-clock-fields a,b,c] [--pause-ms MS]
//                            [--only realtime,lockstep,errors]
//
// 1. GetModelInfo, and observations built from it (feature count, names, normalisation).
// 2. REALTIME: 20 Hz observations for ~2.6 s with a small HTTP/2 receive window; the client stalls
//    twice (a paused reader, a busy event loop) and must then find a short backlog, not every tick
//    of the stall (the server conflates and counts the drops).
// 3. LOCKSTEP twice, concurrently, with the same observation stream (declared period, a sensor
//    profile, plans, an out-of-distribution stretch and a stale plan): the snapshots must be
//    byte-identical apart from the wall-clock fields and the session id.
// 4. Bad inputs: each gets the documented status code, and the server keeps serving.
// The last line of output is a JSON summary.
import path from 'node:path';
import stream from 'node:stream';
import { fileURLToPath } from 'node:url';

import grpc from '@grpc/grpc-js';
import protoLoader from '@grpc/proto-loader';

const PROTO_ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../proto');
const LOAD_OPTIONS = { includeDirs: [PROTO_ROOT], keepCase: true, longs: String, enums: String, defaults: true, oneofs: true };
const definition = protoLoader.loadSync('dualloop/v2/controller.proto', LOAD_OPTIONS);
const v2 = grpc.loadPackageDefinition(definition).dualloop.v2;
const DRIVE = definition['dualloop.v2.ControllerService'].Drive;
const fieldNumbers = (message) => new Map(definition[`dualloop.v2.${message}`].type.field.map((f) => [f.name, f.number]));
const SNAPSHOT_FIELDS = fieldNumbers('DecisionSnapshot');
const RESPONSE_SNAPSHOT = fieldNumbers('DriveResponse').get('snapshot');

const PARTS = ['realtime', 'lockstep', 'errors'];
const args = parseArgs(process.argv.slice(2));
const MS = 1_000_000n;
const failures = [];
const summary = { ok: false, address: args.address };

function parseArgs(argv) {
  const out = { address: '', window: 8192, pauseMs: 700, wallClock: ['emit_time_ns', 'lateness_us', 'timings'], only: PARTS };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === '--window') out.window = Number(argv[++i]);
    else if (a === '--pause-ms') out.pauseMs = Number(argv[++i]);
    else if (a === '--wall-clock-fields') out.wallClock = argv[++i].split(',').filter(Boolean);
    else if (a === '--only') out.only = argv[++i].split(',');
    else if (!a.startsWith('--') && !out.address) out.address = a;
    else usage(`unknown argument ${a}`);
  }
  if (!out.address) usage('the server address is missing');
  if (!Number.isInteger(out.window) || out.window < 0) usage('--window takes a byte count (0: grpc-js default)');
  if (!Number.isInteger(out.pauseMs) || out.pauseMs < 100) usage('--pause-ms takes milliseconds (at least 100)');
  if (out.only.some((p) => !PARTS.includes(p))) usage(`--only takes some of ${PARTS.join(',')}`);
  return out;
}

function usage(message) {
  console.error(`${message}\nusage: node check.mjs HOST:PORT [--window BYTES] [--wall-clock-fields a,b,c] [--pause-ms MS] [--only ${PARTS}]`);
  process.exit(2);
}

function check(name, ok, detail = '') {
  console.log(`${ok ? 'ok  ' : 'FAIL'} ${name}${detail ? `: ${detail}` : ''}`);
  if (!ok) failures.push(detail ? `${name}: ${detail}` : name);
  return ok;
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const now = () => process.hrtime.bigint(); // CLOCK_MONOTONIC, as the server's emit_time_ns on Linux

// A deterministic, plausible feature row from the schema alone: flags at their usual value, the
// rest swaying around their training mean by a tenth of a standard deviation (a std is not a
// range: curvature's is 1 /m, so it sways by 0.001 /m, a 1 km radius). Missing features are NaN.
function features(info, k, provided = null, amplitude = 0.1) {
  return info.features.map((f, i) => {
    if (provided && !provided.has(f.name)) return NaN;
    if (f.unit === 'bool') return f.mean > 0.5 ? 1 : 0;
    const sway = Math.sin(0.37 * k + 0.5 * i);
    return f.unit === '1/m' ? 0.001 * sway : f.mean + amplitude * f.std * sway;
  });
}

// One Drive stream. raw: also keep each response's wire bytes (for the determinism check).
function drive(client, open, { raw = false, deadlineMs = 30_000 } = {}) {
  const deserialize = raw ? (buf) => ({ bytes: Buffer.from(buf), ...DRIVE.responseDeserialize(buf) }) : DRIVE.responseDeserialize;
  const call = client.makeBidiStreamRequest(DRIVE.path, DRIVE.requestSerialize, deserialize, new grpc.Metadata(),
    { deadline: Date.now() + deadlineMs });
  const snapshots = [];
  let opened = null;
  const openedPromise = new Promise((resolve, reject) => {
    call.on('data', (msg) => {
      if (msg.msg === 'opened') { opened = msg.opened; resolve(opened); } else snapshots.push(msg);
    });
    call.on('error', reject);
  });
  const done = new Promise((resolve) => {
    call.on('error', (err) => resolve(err));
    call.on('end', () => resolve(null));
  });
  if (open) call.write({ open });
  return { call, snapshots, opened: openedPromise, done };
}

const unary = (client, method, request) => new Promise((resolve, reject) =>
  client[method](request, { deadline: Date.now() + 10_000 }, (err, reply) => (err ? reject(err) : resolve(reply))));

// --- the wire format, just enough to drop fields from a DecisionSnapshot -------------------------
function varint(buf, pos) {
  let value = 0n;
  for (let shift = 0n; ; shift += 7n) {
    const b = buf[pos++];
    value |= BigInt(b & 0x7f) << shift;
    if (!(b & 0x80)) return [value, pos];
  }
}

function wireFields(buf) {
  const out = [];
  for (let pos = 0; pos < buf.length;) {
    const start = pos;
    let key, len;
    [key, pos] = varint(buf, pos);
    const number = Number(key >> 3n), type = Number(key & 7n);
    let body = pos;
    if (type === 0) [, pos] = varint(buf, pos);
    else if (type === 1) pos += 8;
    else if (type === 5) pos += 4;
    else if (type === 2) { [len, body] = varint(buf, pos); pos = body + Number(len); }
    else throw new Error(`unexpected wire type ${type} in field ${number}`);
    out.push({ number, start, body, end: pos });
  }
  return out;
}

// The snapshot's bytes as the server sent them, minus the given field numbers.
function snapshotBytesWithout(driveResponseBytes, drop) {
  const snap = wireFields(driveResponseBytes).find((f) => f.number === RESPONSE_SNAPSHOT);
  const payload = driveResponseBytes.subarray(snap.body, snap.end);
  return Buffer.concat(wireFields(payload).filter((f) => !drop.has(f.number)).map((f) => payload.subarray(f.start, f.end)));
}

// --- 1. the model's schema ------------------------------------------------------------------------
async function modelInfo(client) {
  const info = (await unary(client, 'GetModelInfo', {})).model;
  check('GetModelInfo', info.features.length > 0 && info.actions.length > 0,
    `${info.features.length} features, ${info.actions.length} actions, model ${info.model_version.slice(0, 12)}`);
  summary.model = { version: info.model_version, features: info.features.length, tick_period_ns: info.tick_period_ns };
  return info;
}

// --- 2. REALTIME with a small receive window --------------------------------------------------------
// What a client that falls behind reads next: grpc-js buffers in three places. The HTTP/2 stream
// window ('grpc-node.flow_control_window', sent as SETTINGS_INITIAL_WINDOW_SIZE; grpc-js's default
// is 64 KiB and grows no further) bounds what the server may send unread. On top of it, Node's
// Http2Stream buffers up to its highWaterMark (16 KiB) and grpc-js's object stream 16 messages once
// the reader pauses; a blocked event loop reads nothing, so only the window counts. The server's
// outbox conflates the rest (newest wins) and counts it in snapshots_dropped.
function smallReceiveBuffers(windowBytes) {
  stream.setDefaultHighWaterMark(false, Math.min(windowBytes, 1024)); // process-wide: streams created later
  stream.setDefaultHighWaterMark(true, 1);
  return { 'grpc-node.flow_control_window': windowBytes, 'grpc.use_local_subchannel_pool': 1 };
}

async function realtime(info) {
  // --window 0: grpc-js's defaults, to see the backlog they give (the check then fails).
  const options = args.window > 0 ? smallReceiveBuffers(args.window) : {};
  const client = new v2.ControllerService(args.address, grpc.credentials.createInsecure(), options);
  const tick = BigInt(info.tick_period_ns);
  const s = drive(client, { session_id: `node-rt-${process.pid}`, clock: 'CLOCK_MODE_REALTIME', observation_period_ns: String(50n * MS) });
  const opened = await s.opened;
  check('REALTIME opened', opened.clock === 'CLOCK_MODE_REALTIME' && BigInt(opened.tick_period_ns) === tick, `tick ${opened.tick_period_ns} ns`);

  const arrivals = []; // every snapshot with its arrival time
  s.call.on('data', (msg) => { if (msg.msg === 'snapshot') arrivals.push({ at: now(), snap: msg.snapshot }); });
  let seq = 0;
  const sender = setInterval(() => {
    seq += 1;
    s.call.write({ observation: { seq: String(seq), timestamp_ns: String(now()), features: features(info, seq) } });
  }, 50); // 20 Hz
  const stalls = [];
  const stall = async (kind, fn) => {
    await sleep(400); // reading freely
    const from = arrivals.length, start = now();
    await fn();
    stalls.push({ kind, from, start, end: now() });
  };
  // A reader that stops reading (backpressure through the stream), then a busy event loop.
  await stall('paused reader', async () => { s.call.pause(); await sleep(args.pauseMs); s.call.resume(); });
  await stall('busy event loop', async () => { const end = Date.now() + args.pauseMs; while (Date.now() < end); });
  await sleep(400);
  clearInterval(sender);
  s.call.end();
  const err = await s.done;
  check('REALTIME stream ended cleanly', err === null, err ? `${grpc.status[err.code]}: ${err.details}` : '');

  // Delivery delay = arrival - emit_time_ns (on one host both are CLOCK_MONOTONIC); the offset
  // between the clocks is estimated as the smallest delay seen while reading freely.
  const delay = (a) => Number(a.at - BigInt(a.snap.emit_time_ns)) / 1e6;
  const free = arrivals.slice(0, stalls[0].from);
  check('REALTIME snapshots while reading freely', free.length > 0, `${free.length} in the first 400 ms`);
  const offset = free.length ? Math.min(...free.map(delay)) : 0;
  const r = {
    window_bytes: args.window,
    snapshots: arrivals.length,
    observations: seq,
    max_delay_free_ms: +(Math.max(...free.map(delay)) - offset).toFixed(1),
    clock_offset_ms: +offset.toFixed(3),
    safety_states: count(arrivals.map((a) => a.snap.safety_state)),
  };
  stalls.forEach(({ kind, from, start, end }, i) => {
    const after = arrivals.slice(from, stalls[i + 1]?.from); // up to the next stall
    // The backlog: snapshots read after the stall that the server emitted before it ended.
    const backlog = after.filter((a) => BigInt(a.snap.emit_time_ns) + BigInt(Math.round(offset * 1e6)) < end).length;
    const ticks = Number((end - start) / tick);
    const dropped = after.length && from > 0 ? Number(after.at(-1).snap.snapshots_dropped) - Number(arrivals[from - 1].snap.snapshots_dropped) : 0;
    r[kind.replaceAll(' ', '_')] = { stall_ms: Math.round(Number(end - start) / 1e6), ticks, backlog, snapshots_dropped: dropped,
      oldest_ms: after.length ? +(delay(after[0]) - offset).toFixed(1) : null };
    // With a small window a stalled client finds a few stale snapshots, not every tick of the
    // stall: the server conflated the rest (with grpc-js's defaults it was all of them).
    check(`REALTIME backlog after a ${kind} is short`, after.length > 0 && backlog < ticks / 2,
      `${backlog} stale snapshots after ${r[kind.replaceAll(' ', '_')].stall_ms} ms (${ticks} ticks), snapshots_dropped +${dropped}`);
  });
  summary.realtime = r;
  client.close();
}

function count(values) {
  const out = {};
  for (const v of values) out[v] = (out[v] ?? 0) + 1;
  return out;
}

// --- 3. LOCKSTEP determinism ------------------------------------------------------------------------
async function lockstep(client, info) {
  const names = info.features.map((f) => f.name);
  const provided = names.slice(0, Math.max(1, names.length - 3)); // a sensor that lacks three features
  const period = 100n * MS; // a 10 Hz sensor
  const t0 = 1_000_000_000_000n;
  const observations = [];
  for (let k = 0; k < 30; k++) { // 3 s of sensor time
    // 0.4 s far out of distribution (the gates veto, the safe-state machine holds and recovers)
    const amplitude = k >= 12 && k < 16 ? 6 : 0.1;
    const obs = { seq: String(k + 1), timestamp_ns: String(t0 + BigInt(k) * period), features: features(info, k, new Set(provided), amplitude) };
    // a fresh plan every 0.5 s, with a 1.5 s gap (the plan goes stale)
    if (!info.planner && k % 5 === 0 && (k < 20 || k > 24)) {
      obs.plan = { plan_id: `p${k}`, values: info.plan.map((p, i) => p.mean + (k % 2 ? 0 : 0.1 * p.std * (i % 3))) };
    }
    observations.push(obs);
  }
  const run = async (id) => {
    const s = drive(client, { session_id: id, clock: 'CLOCK_MODE_LOCKSTEP', observation_period_ns: String(period), provided_features: provided }, { raw: true });
    const opened = await s.opened;
    for (const obs of observations) s.call.write({ observation: obs });
    s.call.end();
    const err = await s.done;
    if (err) throw new Error(`LOCKSTEP ${id}: ${grpc.status[err.code]}: ${err.details}`);
    return { opened, snapshots: s.snapshots };
  };
  // Concurrently: a LOCKSTEP session's output never depends on other sessions.
  const [a, b] = await Promise.all([run(`node-ls-a-${process.pid}`), run(`node-ls-b-${process.pid}`)]);
  check('LOCKSTEP opened with the declared rate and profile',
    BigInt(a.opened.observation_period_ns) === period && a.opened.provided_features.join() === provided.join(),
    `period ${a.opened.observation_period_ns} ns, ${a.opened.provided_features.length}/${names.length} features`);

  const unknown = args.wallClock.filter((n) => !SNAPSHOT_FIELDS.has(n));
  check('wall-clock fields exist in DecisionSnapshot', unknown.length === 0, unknown.length ? `unknown: ${unknown.join(', ')}` : args.wallClock.join(', '));
  const drop = new Set([...args.wallClock, 'session_id'].map((n) => SNAPSHOT_FIELDS.get(n)).filter((n) => n !== undefined));
  // 29 gaps of 100 ms on 5 ms ticks, plus the first observation's own tick
  const expected = Number((BigInt(observations.length - 1) * period) / BigInt(info.tick_period_ns)) + 1;
  check('LOCKSTEP one snapshot per tick', a.snapshots.length === expected && b.snapshots.length === expected,
    `${a.snapshots.length} and ${b.snapshots.length}, expected ${expected}`);
  let firstDiff = -1;
  for (let i = 0; i < Math.max(a.snapshots.length, b.snapshots.length); i++) {
    const x = a.snapshots[i], y = b.snapshots[i];
    if (!x || !y || !snapshotBytesWithout(x.bytes, drop).equals(snapshotBytesWithout(y.bytes, drop))) { firstDiff = i; break; }
  }
  const identical = firstDiff < 0 && a.snapshots.length > 0;
  check('LOCKSTEP byte-identical apart from wall-clock fields', identical,
    identical ? `${a.snapshots.length} snapshots` : `first difference at snapshot ${firstDiff}`);
  const snaps = a.snapshots.map((m) => m.snapshot);
  check('LOCKSTEP ticks count from 0 and follow observation time',
    snaps.every((s, i) => BigInt(s.tick) === BigInt(i) && BigInt(s.scheduled_time_ns) === t0 + BigInt(i) * BigInt(info.tick_period_ns)));
  check('LOCKSTEP applied actions are named and finite',
    snaps.every((s) => info.actions.includes(s.applied.name) && s.applied.controls.every(Number.isFinite)));
  summary.lockstep = {
    snapshots: a.snapshots.length,
    identical,
    first_difference: firstDiff,
    compared_without: [...args.wallClock, 'session_id'],
    observations: observations.length,
    held: snaps.filter((s) => s.observation_held).length,
    safety_states: count(snaps.map((s) => s.safety_state)),
    reasons: count(snaps.flatMap((s) => s.reasons)),
  };
}

// --- 4. bad inputs --------------------------------------------------------------------------------
async function badInputs(client, info) {
  const n = info.features.length;
  const good = (k) => ({ observation: { seq: String(k), timestamp_ns: String(BigInt(k) * 5n * MS), features: features(info, k) } });
  const cases = [
    ['wrong feature count', 'INVALID_ARGUMENT', { clock: 'CLOCK_MODE_LOCKSTEP' }, [{ observation: { seq: '1', timestamp_ns: '1', features: [1, 2] } }], String(n)],
    ['first message not open', 'INVALID_ARGUMENT', null, [good(1)], 'open'],
    ['unknown clock', 'INVALID_ARGUMENT', { clock: 'CLOCK_MODE_UNSPECIFIED' }, [], 'clock'],
    ['unknown provided feature', 'INVALID_ARGUMENT', { clock: 'CLOCK_MODE_LOCKSTEP', provided_features: ['no_such_feature'] }, [], 'no_such_feature'],
    ['seq not increasing', 'INVALID_ARGUMENT', { clock: 'CLOCK_MODE_LOCKSTEP' }, [good(2), { observation: { ...good(3).observation, seq: '2' } }], 'seq'],
    ['LOCKSTEP time going back', 'INVALID_ARGUMENT', { clock: 'CLOCK_MODE_LOCKSTEP' }, [good(2), { observation: { ...good(1).observation, seq: '3' } }], 'timestamp'],
    ['schema hash mismatch', 'FAILED_PRECONDITION', { clock: 'CLOCK_MODE_LOCKSTEP', expected_schema_hash: 'not-this-one' }, [], 'schema'],
  ];
  const results = {};
  for (const [name, code, open, messages, mention] of cases) {
    const s = drive(client, open ? { session_id: `node-bad-${process.pid}`, ...open } : null, { deadlineMs: 10_000 });
    s.opened.catch(() => {}); // some are refused before `opened`
    for (const m of messages) s.call.write(m);
    // Leave the stream open: the server must end it with the status, not wait for the client.
    const err = await s.done;
    s.call.end();
    const got = err ? grpc.status[err.code] : 'OK';
    results[name] = got;
    check(`bad input: ${name} -> ${code}`, got === code && err.details.includes(mention), err ? `${got}: ${err.details}` : 'no error');
  }
  // the same id twice at once
  const first = drive(client, { session_id: `node-dup-${process.pid}`, clock: 'CLOCK_MODE_LOCKSTEP' });
  await first.opened;
  const second = drive(client, { session_id: `node-dup-${process.pid}`, clock: 'CLOCK_MODE_LOCKSTEP' });
  second.opened.catch(() => {});
  const dup = await second.done;
  results['session id already open'] = dup ? grpc.status[dup.code] : 'OK';
  check('bad input: session id already open -> ALREADY_EXISTS', dup?.code === grpc.status.ALREADY_EXISTS, dup ? dup.details : 'no error');
  first.call.end();
  await first.done;
  const again = (await unary(client, 'GetModelInfo', {})).model;
  check('server still serving after bad inputs', again.features.length === n);
  summary.bad_inputs = results;
}

async function main() {
  const watchdog = setTimeout(() => { check('finished within 120 s', false); finish(); }, 120_000);
  const client = new v2.ControllerService(args.address, grpc.credentials.createInsecure());
  try {
    const info = await modelInfo(client);
    if (args.only.includes('realtime')) await realtime(info);
    if (args.only.includes('lockstep')) await lockstep(client, info);
    if (args.only.includes('errors')) await badInputs(client, info);
  } catch (err) {
    // a refused call (no server, no token) by its status name and message; anything else with its stack
    const refused = typeof err?.code === 'number' && grpc.status[err.code] !== undefined;
    check('no unexpected error', false, refused ? `${grpc.status[err.code]}: ${err.details}` : err?.stack ?? String(err));
  }
  clearTimeout(watchdog);
  client.close();
  finish();
}

function finish() {
  summary.ok = failures.length === 0;
  summary.failures = failures;
  console.log(JSON.stringify(summary));
  process.exit(summary.ok ? 0 : 1);
}

await main();
