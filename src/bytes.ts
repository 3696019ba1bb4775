// Sizes in messages: the bounds a user meets in an error ("larger than 16 MiB").

/** 16 MiB, 96.2 MiB, 64 KiB, 300 bytes. */
export function formatSize(bytes: number): string {
  if (bytes >= 1 << 20) return `${Number((bytes / (1 << 20)).toFixed(1))} MiB`;
  if (bytes >= 1 << 10) return `${Number((bytes / (1 << 10)).toFixed(1))} KiB`;
  return `${bytes} bytes`;
}
