// `svc engine [--model ID] [--port N] [--host H] [--chaos] [--boot-delay-ms N] [--boot-fail] [--start-stall-ms N]
// [--chaos-mode MODE]`:
// one reference engine, in the foreground, until SIGTERM/SIGINT. Prints one JSON line {"event":"listening","url",...}
// on stdout when ready, after a line {"event":"stage","stage":...} per boot stage (src/platforms reads them).
import { defaultModel, type Settings } from '../config/index.ts';
import { startReferenceEngine } from '../reference-engine/index.ts';
import { chaosModes, type ChaosMode } from '../reference-engine/chaos.ts';

export async function engineCommand(args: string[], settings: Settings): Promise<number> {
  const flags: Record<string, string | true> = {};
  for (let i = 0; i < args.length; i++) {
    const a = args[i];
    if (!a.startsWith('--')) {
      process.stderr.write(`svc engine: unexpected argument "${a}"\n`);
      return 2;
    }
    const [name, inline] = a.slice(2).split('=', 2);
    if (name === 'chaos' || name === 'boot-fail') flags[name] = true;
    else if (['model', 'port', 'host', 'boot-delay-ms', 'start-stall-ms', 'chaos-mode'].includes(name)) {
      const value = inline ?? args[++i];
      if (value === undefined) {
        process.stderr.write(`svc engine: --${name} needs a value\n`);
        return 2;
      }
      flags[name] = value;
    } else {
      process.stderr.write(`svc engine: unknown flag --${name}\n`);
      return 2;
    }
  }
  const modelId = typeof flags.model === 'string' ? flags.model : defaultModel(settings.models).id;
  const model = settings.models.find((m) => m.id === modelId);
  if (!model) {
    process.stderr.write(`svc engine: unknown model "${modelId}" (configured: ${settings.models.map((m) => m.id).join(', ')})\n`);
    return 2;
  }
  if (!model.architecture) {
    process.stderr.write(`svc engine: model "${model.id}" has no architecture; it is served by ${model.engine}\n`);
    return 2;
  }
  // A process that stalls before the platform sees it start (the platforms' stall tests).
  const stall = Number(flags['start-stall-ms'] ?? 0);
  if (stall > 0) await new Promise((r) => setTimeout(r, stall));
  const stage = (name: string) => process.stdout.write(`${JSON.stringify({ event: 'stage', stage: name })}\n`);
  stage('container_started');
  const port = Number(flags.port ?? 0);
  // The environment's slow boot is a chaos setting; an explicit flag always applies.
  const bootDelay = Number(flags['boot-delay-ms'] ?? (flags.chaos === true ? (process.env.SVC_ENGINE_BOOT_DELAY_MS ?? 0) : 0));
  if (!Number.isInteger(port) || port < 0 || port > 65535 || !Number.isFinite(bootDelay) || bootDelay < 0) {
    process.stderr.write('svc engine: --port must be 0..65535 and --boot-delay-ms a non-negative number\n');
    return 2;
  }
  // The first completion fails this way (a failure right after a boot: the cold-boot tests).
  const chaosMode = flags['chaos-mode'];
  if (chaosMode !== undefined && (flags.chaos !== true || !chaosModes.includes(chaosMode as ChaosMode))) {
    process.stderr.write(`svc engine: --chaos-mode needs --chaos and one of ${chaosModes.join(', ')}\n`);
    return 2;
  }
  const engine = await startReferenceEngine(model, {
    host: typeof flags.host === 'string' ? flags.host : '127.0.0.1',
    port,
    chaos: flags.chaos === true,
    bootDelayMs: bootDelay,
    exitOnCrash: true,
    bootFail: flags['boot-fail'] === true,
    chaosMode: chaosMode as ChaosMode | undefined,
    onStage: stage,
  });
  process.stdout.write(`${JSON.stringify({ event: 'listening', url: engine.url, model: model.id, checkpoint: model.checkpoint, pid: process.pid })}\n`);
  await new Promise<void>((resolve) => {
    process.once('SIGTERM', () => resolve());
    process.once('SIGINT', () => resolve());
    // A gateway killed without the chance to stop its engines must not leave them holding ports: when the
    // parent goes, the process is re-parented and its ppid changes.
    const parent = process.ppid;
    setInterval(() => {
      if (process.ppid !== parent) resolve();
    }, 1000).unref();
  });
  await engine.close();
  return 0;
}
