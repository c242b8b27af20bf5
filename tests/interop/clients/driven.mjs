// Many runs of the Node client scripts in one process: the Node half of driven.py, which says why
// and gives the protocol (one JSON command per stdin line, one JSON message per stdout line).
//
// A client script exports `async function run(argv, io)`, which returns its result (a JSON-able
// object), and ends with `if (isMain(import.meta.url)) byHand(run);` so that it still runs by
// hand. `io`: say(line) says one line; stop(word, payload) says `word {payload JSON}` and waits to
// be released; onCancel(fn) registers what closes the run's client when the run is cancelled.
//
// `node driven.mjs` is the driver that tests/interop/drivers.py starts once per pytest worker.
import { createInterface } from 'node:readline';
import { pathToFileURL } from 'node:url';

export const isMain = (metaUrl) => Boolean(process.argv[1]) && metaUrl === pathToFileURL(process.argv[1]).href;

// Stops released one line (or one `go`) at a time; a release that comes first is kept.
function releases() {
  let early = 0;
  const waiters = [];
  return {
    release() {
      const waiter = waiters.shift();
      if (waiter) waiter();
      else early++;
    },
    next() {
      if (early > 0) {
        early--;
        return Promise.resolve();
      }
      return new Promise((resolve) => waiters.push(resolve));
    },
  };
}

// What `work()` gives, or what `late()` gives if it has not settled within `ms`; `close()` runs
// either way, so that a run's connections close with it, as they did with a process of its own.
export async function bounded(ms, work, late, close) {
  let timer;
  const timedOut = new Promise((resolve) => {
    timer = setTimeout(() => resolve(late()), ms);
  });
  try {
    return await Promise.race([work(), timedOut]);
  } finally {
    clearTimeout(timer);
    await Promise.resolve()
      .then(close)
      .catch(() => {});
  }
}

// A run by hand: lines on stdout, each stop released by a line on stdin; exits when it is done.
export async function byHand(run) {
  const stops = releases();
  createInterface({ input: process.stdin }).on('line', () => stops.release());
  const io = {
    say: (line) => console.log(line),
    stop: (word, payload) => {
      io.say(`${word} ${JSON.stringify(payload)}`);
      return stops.next();
    },
    onCancel: () => {},
  };
  const result = await run(process.argv.slice(2), io);
  // Exit once written: process.exit() right after a write to a pipe cuts off what did not fit
  // the pipe's buffer (a long result, such as an app's HTML).
  process.stdout.write(JSON.stringify(result) + '\n', () => process.exit(0));
}

function drive() {
  const runs = new Map();
  const send = (message) => process.stdout.write(JSON.stringify(message) + '\n');
  // A run's stray failure is its own, not the driver's: it is reported on stderr.
  process.on('unhandledRejection', (e) => console.error('unhandled rejection:', e));
  process.on('uncaughtException', (e) => console.error('uncaught exception:', e));

  async function start(id, script, argv) {
    const stops = releases();
    let cancelled;
    const entry = { stops, cancels: [], cancelled: new Promise((resolve) => (cancelled = resolve)) };
    entry.cancel = async () => {
      for (const close of entry.cancels) await Promise.resolve().then(close).catch(() => {});
      cancelled('cancelled');
    };
    runs.set(id, entry);
    const io = {
      say: (line) => send({ id, line }),
      stop: (word, payload) => {
        io.say(`${word} ${JSON.stringify(payload)}`);
        return stops.next();
      },
      onCancel: (close) => entry.cancels.push(close),
    };
    try {
      const { run } = await import(`./${script}.mjs`);
      const result = await Promise.race([run(argv, io), entry.cancelled]);
      if (result === 'cancelled') send({ id, err: 'cancelled' });
      else io.say(JSON.stringify(result));
    } catch (e) {
      send({ id, err: String(e?.stack ?? e) });
    } finally {
      runs.delete(id);
      send({ id, end: true });
    }
  }

  const input = createInterface({ input: process.stdin });
  input.on('line', (line) => {
    const command = JSON.parse(line);
    const entry = runs.get(command.id);
    if (command.script) start(command.id, command.script, command.argv);
    else if (entry && command.go) entry.stops.release();
    else if (entry && command.cancel) entry.cancel();
  });
  // stdin's end: every run is cancelled, then the driver exits.
  input.on('close', async () => {
    await Promise.allSettled([...runs.values()].map((entry) => entry.cancel()));
    process.exit(0);
  });
}

if (isMain(import.meta.url)) drive();
