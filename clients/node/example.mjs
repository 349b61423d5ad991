// A minimal dualloop client, from proto/ alone: node example.mjs HOST:PORT (docs/contract.md).
import stream from 'node:stream';
import grpc from '@grpc/grpc-js';
import protoLoader from '@grpc/proto-loader';

if (process.argv.length !== 3 || !process.argv[2]) { // the server's address is the one argument
  console.error('usage: node example.mjs HOST:PORT (the address `dualloop serve` announces)');
  process.exit(2);
}
// A refused call (no server, no token, a refused session, a bad observation): the status says why.
const fail = (err) => { console.error(`${grpc.status[err.code]}: ${err.details}`); process.exit(1); };

const proto = new URL('../../proto', import.meta.url).pathname;
const definition = protoLoader.loadSync('dualloop/v2/controller.proto',
  { includeDirs: [proto], keepCase: true, longs: String, enums: String, defaults: true, oneofs: true });
const { ControllerService } = grpc.loadPackageDefinition(definition).dualloop.v2;

// A small receive window and small stream buffers: a client that falls behind reads the newest
// snapshot after a short backlog; the server drops the rest (snapshots_dropped).
stream.setDefaultHighWaterMark(false, 1024);
stream.setDefaultHighWaterMark(true, 1);
const client = new ControllerService(process.argv[2], grpc.credentials.createInsecure(),
  { 'grpc-node.flow_control_window': 8192 });

const info = await new Promise((ok, refused) => client.GetModelInfo({}, { deadline: Date.now() + 10_000 },
  (e, r) => (e ? refused(e) : ok(r.model)))).catch(fail); // the schema to build observations from
const call = client.Drive();
call.write({ open: { clock: 'CLOCK_MODE_REALTIME', observation_period_ns: String(50_000_000) } }); // first: open, 20 Hz
let latest = null;
call.on('data', (msg) => {
  if (msg.msg === 'opened') return console.log(`session ${msg.opened.session_id}, tick ${msg.opened.tick_period_ns} ns`);
  if (latest?.safety_state !== msg.snapshot.safety_state) { // SAFETY_STATE_NOMINAL, _VETO_HOLD, ...
    console.log(`tick ${msg.snapshot.tick}: ${msg.snapshot.safety_state} ${msg.snapshot.reasons.join(',')}`);
  }
  latest = msg.snapshot; // actuate latest.applied, never latest.proposed
});
call.on('error', fail);
call.on('end', () => {
  console.log(`last: ${latest.applied.name} [${latest.applied.controls}] ${latest.safety_state}`);
  client.close();
});
// A steady cruise at 20 m/s, 40 m behind a lead at the same speed, mid-lane on a straight road, as a
// sensor reads it: each value with a little noise (a reading that never changes looks stuck).
const cruise = { ego_speed: [20, 0.02], ego_accel: [0, 0.05], lead_distance: [40, 0.1] };
const reading = (f, i, seq) => {
  const [value, noise] = cruise[f.name] ?? (f.unit === 'bool' ? [1, 0] : f.unit === '1/m' ? [0, 1e-5]
    : f.name.endsWith('_gap') ? [f.mean, 0.1] : [0, 0.005]); // lanes and lead present, a straight road
  return value + noise * Math.sin(12.9898 * seq + 78.233 * i); // a different small offset each reading
};
for (let seq = 1; seq <= 20; seq++) { // 1 s at 20 Hz: in ModelInfo.features order and units
  const features = info.features.map((f, i) => reading(f, i, seq));
  call.write({ observation: { seq: String(seq), timestamp_ns: String(process.hrtime.bigint()), features } });
  await new Promise((ok) => setTimeout(ok, 50));
}
call.end(); // half-close: the server ends the session and the stream
