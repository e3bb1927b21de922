/**
 * The Vulkan driver for onnxruntime-node's WebGPU provider (webgpu-node.ts) on Linux.
 *
 * When $VK_ICD_FILENAMES / $VK_DRIVER_FILES are unset and no Vulkan driver is installed where
 * the Vulkan loader looks (its ICD manifest directories), VK_ICD_FILENAMES is set to the first of:
 * the NVIDIA container toolkit's manifest (/usr/local/nvidia/share/vulkan/icd.d, which the loader
 * does not search), or Chromium's bundled SwiftShader (Vulkan on the CPU: exact, slow). When no
 * libvulkan.so.1 is on the library path, a loader beside the manifest or Chromium's own is loaded
 * into the process first, so that Dawn's dlopen('libvulkan.so.1') finds it (glibc matches a
 * loaded library by its soname). The variable is read by the C library, so prepareVulkan() runs
 * in the main thread (a worker thread's process.env is a copy): headless-engine.ts calls it before
 * its thread starts, and the thread's copy carries what it set.
 */
import { existsSync, readdirSync } from 'node:fs';
import { homedir } from 'node:os';
import * as path from 'node:path';

/** what prepareVulkan found and did (Linux; elsewhere Dawn uses Metal or D3D12 and nothing is set) */
export interface VulkanSetup {
  /**
   * 'environment': $VK_ICD_FILENAMES / $VK_DRIVER_FILES given · 'system': installed drivers ·
   * 'nvidia-container' / 'swiftshader': found and set here · 'none'
   */
  drivers: 'environment' | 'system' | 'nvidia-container' | 'swiftshader' | 'none' | 'not-linux';
  /** the driver manifests (ICD JSON files) the loader will read */
  icd: string[];
  /** the libvulkan.so.1 loaded here, when the library path has none */
  loader?: string;
  /** why nothing usable was found */
  missing?: string;
}

const LIB_DIRS = [
  '/lib/x86_64-linux-gnu',
  '/usr/lib/x86_64-linux-gnu',
  '/lib/aarch64-linux-gnu',
  '/usr/lib/aarch64-linux-gnu',
  '/lib64',
  '/usr/lib64',
  '/lib',
  '/usr/lib',
  '/usr/local/lib',
];
/** where Chromium (and Chrome) keep SwiftShader's Vulkan ICD and a Vulkan loader */
const SWIFTSHADER_DIRS = [
  '/usr/lib/chromium',
  '/usr/lib64/chromium',
  '/usr/lib/chromium-browser',
  '/opt/google/chrome',
];
const SWIFTSHADER_ICD = 'vk_swiftshader_icd.json';
/** the NVIDIA container toolkit's driver manifests: outside the loader's search path */
const NVIDIA_CONTAINER_ICDS = '/usr/local/nvidia/share/vulkan/icd.d';

/** Chromium's SwiftShader manifest, where one is installed */
export function swiftShaderIcd(): string | undefined {
  return SWIFTSHADER_DIRS.map((d) => path.join(d, SWIFTSHADER_ICD)).find((f) => existsSync(f));
}
/** glibc's RTLD_NODELETE (os.constants.dlopen does not list it): the loader stays after process.dlopen finds no addon in it */
const RTLD_NODELETE = 0x1000;

/** the Vulkan loader's manifest directories (its documented search order, XDG defaults included) */
function icdDirs(env: NodeJS.ProcessEnv): string[] {
  const config = (env.XDG_CONFIG_DIRS || '/etc/xdg').split(':');
  const data = [
    env.XDG_DATA_HOME || path.join(homedir(), '.local/share'),
    ...(env.XDG_DATA_DIRS || '/usr/local/share:/usr/share').split(':'),
  ];
  return [...config, '/etc', ...data].filter(Boolean).map((d) => path.join(d, 'vulkan', 'icd.d'));
}

function manifests(dir: string): string[] {
  try {
    return readdirSync(dir)
      .filter((f) => f.endsWith('.json'))
      .map((f) => path.join(dir, f));
  } catch {
    return [];
  }
}

function systemLoader(env: NodeJS.ProcessEnv): string | undefined {
  const dirs = [...(env.LD_LIBRARY_PATH ?? '').split(':').filter(Boolean), ...LIB_DIRS];
  return dirs.map((d) => path.join(d, 'libvulkan.so.1')).find((p) => existsSync(p));
}

function loadLoader(file: string): boolean {
  try {
    process.dlopen({ exports: {} }, file, RTLD_NODELETE | 2 /* RTLD_NOW */ | 256 /* RTLD_GLOBAL */);
    return true;
  } catch (e) {
    // loaded, and not a Node addon: that is what is wanted
    return /did not self-register/.test((e as Error).message);
  }
}

let prepared: VulkanSetup | undefined;

/** Point the Vulkan loader at a driver (see the header). Once per thread; first in the main thread. */
export function prepareVulkan(env: NodeJS.ProcessEnv = process.env): VulkanSetup {
  if (prepared) return prepared;
  if (process.platform !== 'linux') return (prepared = { drivers: 'not-linux', icd: [] });
  const given = env.VK_ICD_FILENAMES || env.VK_DRIVER_FILES;
  let setup: VulkanSetup;
  if (given) {
    const icd = given.split(':').filter(Boolean);
    const absent = icd.filter((f) => !existsSync(f));
    setup = {
      drivers: 'environment',
      icd,
      ...(absent.length ? { missing: `no such driver manifest: ${absent.join(', ')}` } : {}),
    };
  } else {
    const installed = icdDirs(env).flatMap(manifests);
    const nvidia = manifests(NVIDIA_CONTAINER_ICDS);
    if (installed.length) setup = { drivers: 'system', icd: installed };
    else if (nvidia.length) {
      env.VK_ICD_FILENAMES = nvidia.join(':');
      setup = { drivers: 'nvidia-container', icd: nvidia };
    } else {
      const icd = swiftShaderIcd();
      if (icd) {
        env.VK_ICD_FILENAMES = icd;
        setup = { drivers: 'swiftshader', icd: [env.VK_ICD_FILENAMES] };
      } else
        setup = {
          drivers: 'none',
          icd: [],
          missing:
            `no Vulkan driver: no ICD manifest in ${icdDirs(env).join(', ')}, ` +
            `and no Chromium SwiftShader (${SWIFTSHADER_ICD} in ${SWIFTSHADER_DIRS.join(', ')})`,
        };
    }
  }
  if (!systemLoader(env)) {
    // a loader beside the driver manifest, else Chromium's (the loader works with any driver)
    const candidates = [...setup.icd.map((f) => path.dirname(f)), ...SWIFTSHADER_DIRS].map((d) =>
      path.join(d, 'libvulkan.so.1'),
    );
    const loader = candidates.find((p) => existsSync(p) && loadLoader(p));
    if (loader) setup.loader = loader;
    else
      setup.missing ??= 'no Vulkan loader: libvulkan.so.1 is not on the library path (Debian: apt install libvulkan1)';
  }
  return (prepared = setup);
}
