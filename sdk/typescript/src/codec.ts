/**
 * How JavaScript values become payloads and outputs on the wire, and how they are read back: the same
 * small mapping as the Python SDK's, since the far side of a task may be written in either. Bytes stay
 * bytes, a string is UTF-8 text, `undefined` and `null` are nothing at all, and everything else is JSON.
 */

export const OCTET_STREAM = "application/octet-stream";
export const TEXT = "text/plain; charset=utf-8";
export const JSON_TYPE = "application/json";

const EMPTY = Buffer.alloc(0);

/** Bytes on the wire and their content type. */
export interface Encoded {
  data: Buffer;
  contentType: string;
}

/**
 * The bytes and content type for `value`; an explicit `contentType` replaces the guessed one.
 *
 * JSON is compact and refuses NaN and infinities (which `JSON.stringify` would silently write as
 * `null`, and other languages' parsers reject), BigInt, cycles, and values JSON has no form for (a
 * function, a symbol): those throw a `TypeError` here rather than surprise the far side.
 */
export function encode(value: unknown, contentType?: string): Encoded {
  let data: Buffer;
  let guessed: string;
  if (value === undefined || value === null) {
    data = EMPTY;
    guessed = "";
  } else if (typeof value === "string") {
    data = Buffer.from(value, "utf8");
    guessed = TEXT;
  } else if (value instanceof Uint8Array) {
    data = Buffer.isBuffer(value) ? value : Buffer.from(value.buffer, value.byteOffset, value.byteLength);
    guessed = OCTET_STREAM;
  } else if (value instanceof ArrayBuffer) {
    data = Buffer.from(value);
    guessed = OCTET_STREAM;
  } else {
    const text = JSON.stringify(value, finiteNumbers);
    if (text === undefined) {
      throw new TypeError(`a ${typeof value} has no JSON form`);
    }
    data = Buffer.from(text, "utf8");
    guessed = JSON_TYPE;
  }
  return { data, contentType: contentType ?? guessed };
}

function finiteNumbers(_key: string, value: unknown): unknown {
  if (typeof value === "number" && !Number.isFinite(value)) {
    throw new TypeError(`${value} is not valid JSON`);
  }
  return value;
}

/** Parses JSON; empty data reads as `null`, the inverse of how `null` and `undefined` are encoded. */
export function decodeJson(data: Uint8Array): unknown {
  return data.length === 0 ? null : JSON.parse(decodeText(data));
}

/** UTF-8 text (invalid sequences read as U+FFFD); empty data reads as "". */
export function decodeText(data: Uint8Array): string {
  if (data.length === 0) {
    return "";
  }
  const buffer = Buffer.isBuffer(data) ? data : Buffer.from(data.buffer, data.byteOffset, data.byteLength);
  return buffer.toString("utf8");
}
