// The memory addon (native/memory_addon.cc, build/Release/memory_addon.node): once the start is
// over, the pages of the files the process maps (the node binary above all: about 40 MiB of it
// are touched while Node.js and the modules start, little of it afterwards) are handed back to the
// kernel; those still used come back on their first touch. Not built or not loaded: nothing is
// handed back, and the controller runs as before.

import type { Logger } from 'pino';
import { addonPath, hasFunctions, loadNativeAddon } from '../native-addon.js';

interface MemoryAddon {
  releaseFilePages(): Promise<{ mappings: number; bytes: number; residentBefore: number; residentAfter: number }>;
}

let addon: MemoryAddon | undefined | null;

/**
 * Hands the process's file pages back to the kernel (madvise MADV_PAGEOUT), and logs what it did
 * at debug (or why it could not). Never throws.
 */
export async function releaseFilePages(logger: Logger, path = addonPath('memory_addon.node')): Promise<void> {
  if (addon === undefined) {
    const load = loadNativeAddon(path, (v): v is MemoryAddon => hasFunctions(v, ['releaseFilePages']), {
      missing: (p) => `the memory addon is not built (${p} is missing)`,
      broken: (_, error) => `the memory addon did not load (${error})`,
      notTheAddon: (p) => `${p} is not the memory addon`,
    });
    addon = load.ok ? load.addon : null;
    if (!load.ok) logger.debug({ reason: load.reason }, 'File pages stay resident');
  }
  if (!addon) return;
  try {
    const r = await addon.releaseFilePages();
    const mib = (bytes: number) => Math.round((bytes / 2 ** 20) * 10) / 10;
    logger.debug(
      { mappings: r.mappings, residentBeforeMiB: mib(r.residentBefore), residentAfterMiB: mib(r.residentAfter) },
      'Handed file pages back to the kernel',
    );
  } catch (err) {
    logger.debug({ err }, 'File pages stay resident');
  }
}
