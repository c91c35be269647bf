// Bundled in place of the optional `supports-color` that `debug` (via ioredis) tries to require: in a Node
// single executable a require of anything but a built-in prints a warning, and we want no colour codes in
// JSON logs anyway.
module.exports = false;
