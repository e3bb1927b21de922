/**
 * The pairing token and its hand-off to other companions on this machine.
 *
 * The token is 256 random bits, made when a hub starts and valid for that hub's life. The user
 * gets it in the pairing URL's fragment; a second `loupe mcp` that finds the hub's port taken
 * gets it from a file only this OS user can read (mode 0600 in a 0700 directory, ownership and
 * mode checked before reading). Why a file: every process that could read it runs as the same
 * user and could already read the browser profile, so the file adds no new trust; passing it on
 * a command line or in the environment would expose it to other users via /proc, and asking the
 * hub for it over HTTP would hand it to any local process (or DNS-rebound web page) that asks.
 * The file is removed when the hub stops.
 */
import { createHmac, randomBytes, timingSafeEqual } from 'node:crypto';
import { promises as fs, constants as fsc, readFileSync, unlinkSync } from 'node:fs';
import { LoupeError } from '../engine/errors';
import os from 'node:os';
import path from 'node:path';

export function newToken(): string {
  return randomBytes(32).toString('hex');
}

export function isTokenShaped(s: unknown): s is string {
  return typeof s === 'string' && /^[0-9a-f]{64}$/.test(s);
}

/**
 * Constant-time comparison, so response timing does not leak how much of a guess was right.
 * The candidate comes from a request header (any bytes a local process sends), so its shape is
 * checked first and the comparison is over bytes: `timingSafeEqual` throws on buffers of
 * different byte lengths, and a string of the right character length can have more bytes.
 */
export function tokensEqual(a: unknown, b: string): boolean {
  if (!isTokenShaped(a) || !isTokenShaped(b)) return false;
  const x = Buffer.from(a, 'latin1');
  const y = Buffer.from(b, 'latin1');
  return x.length === y.length && timingSafeEqual(x, y);
}

/**
 * The two proofs of a forwarding connection (protocol.ts, CHALLENGE_PROTOCOL_PREFIX): an
 * HMAC-SHA256 keyed by the token over a nonce the other side chose, with a different label for
 * each direction so that one side's proof can never be replayed as the other's.
 */
export function hubProof(token: string, nonce: string): string {
  return createHmac('sha256', token).update(`loupe hub proof v1\n${nonce}`).digest('hex');
}
export function agentProof(token: string, nonce: string): string {
  return createHmac('sha256', token).update(`loupe agent proof v1\n${nonce}`).digest('hex');
}
/** Constant-time comparison of two proofs (any input; false unless both are 64 hex digits and equal). */
export const proofsEqual = tokensEqual;

/** Per-user config directory: $LOUPE_CONFIG_DIR, else the platform's convention. */
export function configDir(): string {
  if (process.env.LOUPE_CONFIG_DIR) return process.env.LOUPE_CONFIG_DIR;
  if (process.platform === 'win32')
    return path.join(process.env.APPDATA ?? path.join(os.homedir(), 'AppData', 'Roaming'), 'loupe');
  if (process.platform === 'darwin') return path.join(os.homedir(), 'Library', 'Application Support', 'loupe');
  return path.join(process.env.XDG_CONFIG_HOME ?? path.join(os.homedir(), '.config'), 'loupe');
}

export function tokenFilePath(port: number, dir = configDir()): string {
  return path.join(dir, `hub-${port}.json`);
}

export interface HubRecord {
  port: number;
  pid: number;
  token: string;
  started_at: string;
}

/**
 * Create the config directory 0700 if missing, and refuse one that is not a real directory of
 * this user with no access for others: anyone who can write there could replace the token file
 * (and make a forwarding companion talk to their server), anyone who can read it has the token.
 */
export async function ensureConfigDir(dir = configDir()): Promise<void> {
  await fs.mkdir(dir, { recursive: true, mode: 0o700 });
  await checkConfigDir(dir);
}

/** LoupeError CONFIG_UNSAFE unless `dir` is a directory (not a link), owned by this user, mode 0700 or stricter. */
export async function checkConfigDir(dir = configDir()): Promise<void> {
  if (process.platform === 'win32') return; // ACLs, not modes: the per-user profile folder is private already
  const st = await fs.lstat(dir);
  const hint = `Run: chmod 700 ${JSON.stringify(dir)} (it must be a folder of your own, not a link), or point LOUPE_CONFIG_DIR at a private folder.`;
  if (!st.isDirectory())
    throw new LoupeError('CONFIG_UNSAFE', `The Loupe config folder ${dir} is not a folder (a link or a file).`, hint);
  if (typeof process.getuid === 'function' && st.uid !== process.getuid())
    throw new LoupeError('CONFIG_UNSAFE', `The Loupe config folder ${dir} belongs to another user.`, hint);
  if ((st.mode & 0o077) !== 0)
    throw new LoupeError(
      'CONFIG_UNSAFE',
      `The Loupe config folder ${dir} is open to other users (mode ${(st.mode & 0o777).toString(8)}).`,
      hint,
    );
}

/** Write the record atomically with mode 0600 (the temp file is created 0600, then renamed). */
export async function writeHubRecord(rec: HubRecord, dir = configDir()): Promise<string> {
  return writePrivateJson(tokenFilePath(rec.port, dir), rec, dir);
}

/** Write JSON to `file` in the config folder atomically, mode 0600 (a 0600 temp file, then renamed). */
async function writePrivateJson(file: string, data: unknown, dir: string): Promise<string> {
  await ensureConfigDir(dir);
  const tmp = `${file}.${process.pid}.${randomBytes(4).toString('hex')}.tmp`;
  const fh = await fs.open(tmp, fsc.O_WRONLY | fsc.O_CREAT | fsc.O_EXCL | (fsc.O_NOFOLLOW ?? 0), 0o600);
  try {
    await fh.writeFile(JSON.stringify(data));
    await fh.chmod(0o600); // in case a umask or ACL widened it
  } finally {
    await fh.close();
  }
  await fs.rename(tmp, file);
  return file;
}

/**
 * Read the record for a port, refusing a file another user owns or others can read or write
 * (someone could plant a token to make us forward an agent's calls to their server), and a
 * config folder others can reach.
 */
export function readHubRecord(port: number, dir = configDir()): Promise<HubRecord | undefined> {
  return readRecord(tokenFilePath(port, dir), port, dir);
}

async function readRecord(file: string, port: number, dir: string): Promise<HubRecord | undefined> {
  const rec = (await readPrivateJson(file, dir)) as HubRecord | undefined;
  return rec && rec.port === port && isTokenShaped(rec.token) ? rec : undefined;
}

/**
 * JSON from a file of the config folder, or undefined when absent, a link or not JSON; refused
 * (CONFIG_UNSAFE) when another user owns it or others can read or write it, or the folder is
 * open to others. The file is opened once (not following a link) and checked with fstat on that
 * descriptor, so what is checked is what is read.
 */
async function readPrivateJson(file: string, dir: string): Promise<unknown> {
  let fh: fs.FileHandle;
  try {
    fh = await fs.open(file, fsc.O_RDONLY | (fsc.O_NOFOLLOW ?? 0) | (fsc.O_NONBLOCK ?? 0));
  } catch {
    return undefined; // absent, or a symlink (ELOOP): not a file we wrote
  }
  try {
    await checkConfigDir(dir);
    const st = await fh.stat();
    if (!st.isFile() || st.size > 4096) return undefined;
    if (process.platform !== 'win32') {
      if ((st.mode & 0o077) !== 0)
        throw new LoupeError(
          'CONFIG_UNSAFE',
          `${file} is readable or writable by other users (mode ${(st.mode & 0o777).toString(8)}).`,
          'Delete it and restart loupe mcp.',
        );
      if (typeof process.getuid === 'function' && st.uid !== process.getuid())
        throw new LoupeError('CONFIG_UNSAFE', `${file} belongs to another user.`, 'Delete it and restart loupe mcp.');
    }
    try {
      return JSON.parse(await fh.readFile('utf8')) as unknown;
    } catch {
      return undefined;
    }
  } finally {
    await fh.close();
  }
}

/** The record of `loupe serve` on a port (its token), 0600 like a hub's: `loupe mcp --engine` on this machine reads it. */
export function engineRecordPath(port: number, dir = configDir()): string {
  return path.join(dir, `engine-${port}.json`);
}

export async function writeEngineRecord(rec: HubRecord, dir = configDir()): Promise<string> {
  return writePrivateJson(engineRecordPath(rec.port, dir), rec, dir);
}

export function readEngineRecord(port: number, dir = configDir()): Promise<HubRecord | undefined> {
  return readRecord(engineRecordPath(port, dir), port, dir);
}

/** The file holding the bearer token of `loupe mcp --http`. */
export function httpTokenFilePath(dir = configDir()): string {
  return path.join(dir, 'mcp-http.json');
}

/**
 * The bearer token clients of `loupe mcp --http` send: 256 random bits kept in `mcp-http.json`
 * (0600, in the 0700 config folder, as the hub records are) so that a client configured once keeps
 * working across restarts; made when absent or when `rotate` asks for a new one. `created` says
 * whether it is new (the companion then prints it, once).
 */
export async function httpToken(
  o: { rotate?: boolean; dir?: string } = {},
): Promise<{ token: string; file: string; created: boolean }> {
  const dir = o.dir ?? configDir();
  const file = httpTokenFilePath(dir);
  await ensureConfigDir(dir);
  if (!o.rotate) {
    const rec = (await readPrivateJson(file, dir)) as { token?: unknown } | undefined;
    if (rec && isTokenShaped(rec.token)) return { token: rec.token, file, created: false };
  }
  const token = newToken();
  await writePrivateJson(file, { token, created_at: new Date().toISOString() }, dir);
  return { token, file, created: true };
}

/** Remove the record if it is still ours (a newer hub on the same port may have replaced it). */
export async function removeHubRecord(port: number, token: string, dir = configDir()): Promise<void> {
  try {
    const rec = await readHubRecord(port, dir);
    if (rec && tokensEqual(rec.token, token)) await fs.unlink(tokenFilePath(port, dir));
  } catch {
    /* nothing to clean up */
  }
}

/** Synchronous removal for a process that is exiting (an 'exit' handler cannot wait). */
export function removeHubRecordSync(
  port: number,
  token: string,
  dir = configDir(),
  file = tokenFilePath(port, dir),
): void {
  try {
    const rec = JSON.parse(readFileSync(file, 'utf8')) as HubRecord;
    if (tokensEqual(rec.token, token)) unlinkSync(file);
  } catch {
    /* nothing to clean up */
  }
}

function pidAlive(pid: unknown): boolean {
  if (!Number.isInteger(pid) || (pid as number) <= 0) return false;
  try {
    process.kill(pid as number, 0);
    return true;
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === 'EPERM'; // alive, another user's
  }
}

/**
 * Remove hub records whose process is gone (a companion killed with SIGKILL, or a crash the
 * exit handler did not see). Returns the files removed. Records of live processes stay.
 */
export async function removeStaleHubRecords(dir = configDir()): Promise<string[]> {
  let names: string[];
  try {
    names = await fs.readdir(dir);
  } catch {
    return [];
  }
  const removed: string[] = [];
  for (const name of names) {
    const m = /^hub-(\d+)\.json$/.exec(name);
    if (!m) continue;
    try {
      const rec = await readHubRecord(Number(m[1]), dir);
      if (rec && !pidAlive(rec.pid)) {
        await fs.unlink(path.join(dir, name));
        removed.push(name);
      }
    } catch {
      /* unreadable or refused: leave it for the user (the refusal says what to do) */
    }
  }
  return removed;
}
