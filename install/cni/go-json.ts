// JSON as Go's encoding/json reads it, for the installer's model of libcni: the same syntax and the same
// error messages, and a tree that keeps every value's byte offsets and every number's literal text, so the
// installer can splice its entry into another project's file without re-serialising a byte of it.
//
// Go checks the whole input's syntax before decoding anything, so a syntax error always wins over a type
// error; this parser does the same by building the tree first and leaving types to the decoder's callers.

export type GoValue =
  | { kind: 'object'; start: number; end: number; members: GoMember[] }
  | { kind: 'array'; start: number; end: number; items: GoValue[] }
  | { kind: 'string'; start: number; end: number; value: string }
  | { kind: 'number'; start: number; end: number; raw: string }
  | { kind: 'bool'; start: number; end: number; value: boolean }
  | { kind: 'null'; start: number; end: number };

export interface GoMember {
  key: string;
  value: GoValue;
}

/** A syntax error worded as Go's json.SyntaxError. */
export class GoSyntaxError extends Error {
  constructor(message: string, readonly offset: number) {
    super(message);
  }
}

/** Go's quoteChar: how a byte is shown in "invalid character …" (a byte ≥ 0x80 shows as that Latin-1 rune). */
function quoteChar(c: number): string {
  if (c === 0x27) return "'\\''";
  if (c === 0x22) return `'"'`;
  const named: Record<number, string> = { 0x07: '\\a', 0x08: '\\b', 0x0c: '\\f', 0x0a: '\\n', 0x0d: '\\r', 0x09: '\\t', 0x0b: '\\v', 0x5c: '\\\\' };
  if (named[c]) return `'${named[c]}'`;
  if (c < 0x20 || c === 0x7f) return `'\\x${c.toString(16).padStart(2, '0')}'`;
  if ((c >= 0x80 && c <= 0xa0) || c === 0xad) return `'\\u00${c.toString(16).padStart(2, '0')}'`;
  return `'${String.fromCharCode(c)}'`;
}

const isSpace = (c: number) => c === 0x20 || c === 0x09 || c === 0x0a || c === 0x0d;
const isDigit = (c: number) => c >= 0x30 && c <= 0x39;
const isHex = (c: number) => isDigit(c) || (c >= 0x61 && c <= 0x66) || (c >= 0x41 && c <= 0x46);

/** Parses `bytes` as one JSON value, or throws GoSyntaxError with Go's message. */
export function parseGoJson(bytes: Buffer): GoValue {
  let i = 0;
  const n = bytes.length;
  const eof = (): never => {
    throw new GoSyntaxError('unexpected end of JSON input', n);
  };
  const bad = (context: string): never => {
    throw new GoSyntaxError(`invalid character ${quoteChar(bytes[i])} ${context}`, i);
  };
  const skipSpace = () => {
    while (i < n && isSpace(bytes[i])) i++;
  };

  function literal(word: string, value: GoValue): GoValue {
    for (let k = 1; k < word.length; k++) {
      i++;
      if (i >= n) eof();
      if (bytes[i] !== word.charCodeAt(k)) bad(`in literal ${word} (expecting '${word[k]}')`);
    }
    i++;
    value.end = i;
    return value;
  }

  function number(): GoValue {
    const start = i;
    if (bytes[i] === 0x2d) {
      i++;
      if (i >= n) eof();
      if (!isDigit(bytes[i])) bad('in numeric literal');
    }
    if (bytes[i] === 0x30) i++;
    else while (i < n && isDigit(bytes[i])) i++;
    if (i < n && bytes[i] === 0x2e) {
      i++;
      if (i >= n) eof();
      if (!isDigit(bytes[i])) bad('after decimal point in numeric literal');
      while (i < n && isDigit(bytes[i])) i++;
    }
    if (i < n && (bytes[i] === 0x65 || bytes[i] === 0x45)) {
      i++;
      if (i < n && (bytes[i] === 0x2b || bytes[i] === 0x2d)) i++;
      if (i >= n) eof();
      if (!isDigit(bytes[i])) bad('in exponent of numeric literal');
      while (i < n && isDigit(bytes[i])) i++;
    }
    return { kind: 'number', start, end: i, raw: bytes.toString('latin1', start, i) };
  }

  function string(): { value: string; start: number; end: number } {
    const start = i;
    i++; // the opening quote
    let out = '';
    let run = i; // raw runs are cut only at a backslash (ASCII), so no UTF-8 sequence is ever split
    for (;;) {
      if (i >= n) eof();
      const c = bytes[i];
      if (c === 0x22) break;
      if (c < 0x20) bad('in string literal');
      if (c !== 0x5c) {
        i++;
        continue;
      }
      out += bytes.toString('utf8', run, i); // invalid UTF-8 becomes U+FFFD, as Go's decoder makes it
      i++;
      if (i >= n) eof();
      const e = bytes[i];
      const simple: Record<number, string> = { 0x22: '"', 0x5c: '\\', 0x2f: '/', 0x62: '\b', 0x66: '\f', 0x6e: '\n', 0x72: '\r', 0x74: '\t' };
      if (simple[e] !== undefined) {
        out += simple[e];
        i++;
      } else if (e === 0x75) {
        let code = 0;
        for (let k = 0; k < 4; k++) {
          i++;
          if (i >= n) eof();
          if (!isHex(bytes[i])) bad('in \\u hexadecimal character escape');
          code = code * 16 + parseInt(String.fromCharCode(bytes[i]), 16);
        }
        i++;
        out += String.fromCharCode(code);
      } else {
        bad('in string escape code');
      }
      run = i;
    }
    out += bytes.toString('utf8', run, i);
    i++; // the closing quote
    // Go pairs valid surrogate escapes and turns lone ones into U+FFFD.
    const value = out.replace(/[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/g, '\ufffd');
    return { value, start, end: i };
  }

  function value(context: string): GoValue {
    skipSpace();
    if (i >= n) eof();
    const c = bytes[i];
    const start = i;
    if (c === 0x7b) {
      i++;
      const members: GoMember[] = [];
      skipSpace();
      if (i >= n) eof();
      if (bytes[i] === 0x7d) {
        i++;
        return { kind: 'object', start, end: i, members };
      }
      for (;;) {
        skipSpace();
        if (i >= n) eof();
        if (bytes[i] !== 0x22) bad('looking for beginning of object key string');
        const key = string();
        skipSpace();
        if (i >= n) eof();
        if (bytes[i] !== 0x3a) bad('after object key');
        i++;
        members.push({ key: key.value, value: value('looking for beginning of value') });
        skipSpace();
        if (i >= n) eof();
        if (bytes[i] === 0x2c) {
          i++;
          continue;
        }
        if (bytes[i] === 0x7d) {
          i++;
          return { kind: 'object', start, end: i, members };
        }
        bad('after object key:value pair');
      }
    }
    if (c === 0x5b) {
      i++;
      const items: GoValue[] = [];
      skipSpace();
      if (i >= n) eof();
      if (bytes[i] === 0x5d) {
        i++;
        return { kind: 'array', start, end: i, items };
      }
      for (;;) {
        items.push(value('looking for beginning of value'));
        skipSpace();
        if (i >= n) eof();
        if (bytes[i] === 0x2c) {
          i++;
          continue;
        }
        if (bytes[i] === 0x5d) {
          i++;
          return { kind: 'array', start, end: i, items };
        }
        bad('after array element');
      }
    }
    if (c === 0x22) {
      const s = string();
      return { kind: 'string', ...s };
    }
    if (c === 0x2d || isDigit(c)) return number();
    if (c === 0x74) return literal('true', { kind: 'bool', start, end: 0, value: true });
    if (c === 0x66) return literal('false', { kind: 'bool', start, end: 0, value: false });
    if (c === 0x6e) return literal('null', { kind: 'null', start, end: 0 });
    return bad(context);
  }

  const top = value('looking for beginning of value');
  skipSpace();
  if (i < n) bad('after top-level value');
  return top;
}

/** What Go calls a JSON value's kind in "cannot unmarshal <kind> into …". */
export function goKind(v: GoValue): string {
  return v.kind;
}

/**
 * Go's field matching (encoding/json, Go 1.19): a key equal to the field's name wins; otherwise the
 * comparison folds ASCII case, and also the Kelvin sign to k and the long s to s, as Go's fold does.
 */
export function goFieldMatches(key: string, field: string): boolean {
  if (key === field) return true;
  const fold = (s: string) => s.replace(/\u212a/g, 'k').replace(/\u017f/g, 's').replace(/[A-Z]/g, (ch) => ch.toLowerCase());
  return fold(key) === fold(field);
}
