// An error whose message is meant for the user as it is: one line, exit 1 (src/cli/main.ts).

/** An error with a message meant for the user as it is. */
export class FatalError extends Error {
  override name = 'FatalError';
}
