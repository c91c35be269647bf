// Bundled in place of optional native helpers that libraries try to require inside try/catch
// (ws: bufferutil, utf-8-validate; node-fetch: encoding). In a Node single executable a require of
// anything but a built-in prints a warning on stderr; throwing here takes the libraries' own fallback.
throw new Error("optional module not bundled");
