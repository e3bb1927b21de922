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
import { randomBytes, timingSafeEqual } from 'node:crypto';
import { promises as fs, constants as fsc } from 'node:fs';
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

/** Per-user config directory: $LOUPE_CONFIG_DIR, else the platform's convention. */
export function configDir(): string {
  if (process.env.LOUPE_CONFIG_DIR) return process.env.LOUPE_CONFIG_DIR;
  if (process.platform === 'win32') return path.join(process.env.APPDATA ?? path.join(os.homedir(), 'AppData', 'Roaming'), 'loupe');
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

/** Write the record atomically with mode 0600 (the temp file is created 0600, then renamed). */
export async function writeHubRecord(rec: HubRecord, dir = configDir()): Promise<string> {
  await fs.mkdir(dir, { recursive: true, mode: 0o700 });
  const file = tokenFilePath(rec.port, dir);
  const tmp = `${file}.${process.pid}.${randomBytes(4).toString('hex')}.tmp`;
  const fh = await fs.open(tmp, fsc.O_WRONLY | fsc.O_CREAT | fsc.O_EXCL, 0o600);
  try {
    await fh.writeFile(JSON.stringify(rec));
  } finally {
    await fh.close();
  }
  await fs.chmod(tmp, 0o600); // in case a umask or ACL widened it
  await fs.rename(tmp, file);
  return file;
}

/**
 * Read the record for a port, refusing a file another user owns or others can read or write
 * (someone could plant a token to make us forward an agent's calls to their server).
 */
export async function readHubRecord(port: number, dir = configDir()): Promise<HubRecord | undefined> {
  const file = tokenFilePath(port, dir);
  let st;
  try {
    st = await fs.lstat(file);
  } catch {
    return undefined;
  }
  if (!st.isFile()) return undefined;
  if (process.platform !== 'win32') {
    if ((st.mode & 0o077) !== 0) throw new Error(`${file} is readable or writable by other users (mode ${(st.mode & 0o777).toString(8)}); delete it and restart loupe mcp.`);
    if (typeof process.getuid === 'function' && st.uid !== process.getuid()) throw new Error(`${file} belongs to another user; delete it and restart loupe mcp.`);
  }
  try {
    const rec = JSON.parse(await fs.readFile(file, 'utf8')) as HubRecord;
    return rec.port === port && isTokenShaped(rec.token) ? rec : undefined;
  } catch {
    return undefined;
  }
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
