/**
 * Where to connect and how: targets, channel options, credentials, status errors and the shard-redirect
 * rules. `Client` and `runWorker` accept the same target spellings and options, so both build their
 * channels here. The rules are the Python SDK's (`cronoq.client._connect`), so that a worker in either
 * language goes to the same places, and refuses the same ones.
 */

import { isIP } from "node:net";

import * as grpc from "@grpc/grpc-js";

import { ApiError, FailedPrecondition, STATUS_CODES, Unavailable, errorFor } from "./errors.js";

/** Trailing (or initial) metadata of a FAILED_PRECONDITION refusal: the URL of the shard to go to. */
export const SHARD_ENDPOINT_KEY = "cronoq-shard-endpoint";
/** With it: every URL the cluster's shard map gives that shard, comma-separated. */
export const SHARD_ENDPOINTS_KEY = "cronoq-shard-endpoints";

/** TLS settings; a target starting with `https://` uses TLS with the system's roots by itself. */
export interface TlsOptions {
  /** PEM of the certificate authorities to trust instead of the system's. */
  ca?: string | Buffer;
  /** PEM of this client's certificate chain, for mTLS (with `key`). */
  cert?: string | Buffer;
  /** PEM of this client's private key, for mTLS (with `cert`). */
  key?: string | Buffer;
  /** The name to check the server's certificate against, when it is not the target's host. */
  serverName?: string;
}

/** The connection settings `Client` and `runWorker` share. */
export interface ConnectionOptions {
  /** `host:port`, or an `http://`, `https://` or `grpc://` URL (the scheme and a trailing `/` are removed). */
  target: string;
  /** Sent on every call as `authorization: Bearer <token>`. */
  token?: string | undefined;
  /** `true`: TLS with the system's roots; an object: TLS with these settings. `https://` targets always use TLS. */
  tls?: boolean | TlsOptions | undefined;
  /** Credentials made with `@grpc/grpc-js` yourself; they turn TLS on and replace `tls`'s. */
  credentials?: grpc.ChannelCredentials | undefined;
  /** gRPC channel options; each replaces the SDK's default of the same name. */
  channelOptions?: grpc.ChannelOptions | undefined;
}

/**
 * What every SDK channel sets unless the caller's options name the same key, for the reasons the
 * Python SDK gives (docs/sdk-python.md, "Connecting"): messages of any size (a server bounds what it
 * sends by its own `max_message_bytes`, which may be above gRPC's 4 MiB default), keepalive pings while
 * a call is open so that a frozen or cut-off server is noticed, reconnection at most 5 s apart, and a
 * connection of the channel's own.
 */
export const CHANNEL_DEFAULTS: grpc.ChannelOptions = {
  "grpc.max_receive_message_length": -1,
  "grpc.use_local_subchannel_pool": 1,
  "grpc.max_reconnect_backoff_ms": 5_000,
  "grpc.keepalive_time_ms": 20_000,
  "grpc.keepalive_timeout_ms": 10_000,
};

/** Options naming the configured server; they would break TLS host checks against another shard. */
const HOST_BOUND_OPTIONS = ["grpc.ssl_target_name_override", "grpc.default_authority"];

/** A gRPC address (`host:port`) and whether the channel to it uses TLS. */
export class Endpoint {
  constructor(
    readonly address: string,
    readonly secure: boolean,
  ) {}

  /** Strips a scheme prefix; `https://` always means TLS, the others leave `secure` as given. */
  static parse(target: string, secure: boolean): Endpoint {
    if (typeof target !== "string" || target === "") {
      throw new TypeError(`target: expected host:port or an http(s):// URL (got ${JSON.stringify(target)})`);
    }
    for (const prefix of ["https://", "http://", "grpc://"]) {
      if (target.startsWith(prefix)) {
        return new Endpoint(stripSlashes(target.slice(prefix.length)), secure || prefix === "https://");
      }
    }
    return new Endpoint(stripSlashes(target), secure);
  }

  /** One string per endpoint, for maps and sets. */
  get key(): string {
    return `${this.secure ? "https" : "http"}://${this.address}`;
  }

  equals(other: Endpoint): boolean {
    return this.address === other.address && this.secure === other.secure;
  }
}

function stripSlashes(text: string): string {
  return text.replace(/\/+$/, "");
}

/** How a client or worker reaches its configured target and, for a worker, the shards it is sent to. */
export class Connector {
  readonly home: Endpoint;
  readonly metadata: grpc.Metadata;
  private readonly credentials: grpc.ChannelCredentials | undefined;
  private readonly options: grpc.ChannelOptions;

  constructor(options: ConnectionOptions) {
    const tls = options.tls;
    if (tls !== undefined && typeof tls !== "boolean" && (typeof tls !== "object" || tls === null)) {
      throw new TypeError("tls: expected true, false or { ca, cert, key, serverName }");
    }
    this.home = Endpoint.parse(options.target, Boolean(tls) || options.credentials !== undefined);
    this.credentials = options.credentials ?? (typeof tls === "object" ? sslCredentials(tls) : undefined);
    const serverName = typeof tls === "object" ? tls.serverName : undefined;
    this.options = {
      ...CHANNEL_DEFAULTS,
      ...(serverName ? { "grpc.ssl_target_name_override": serverName, "grpc.default_authority": serverName } : {}),
      ...options.channelOptions,
    };
    this.metadata = new grpc.Metadata();
    if (options.token) {
      this.metadata.set("authorization", `Bearer ${options.token}`);
    }
  }

  /** A new channel (a generic client) to `endpoint`; the options naming the configured host are left
   * out for any other. */
  open(endpoint: Endpoint): grpc.Client {
    const credentials = endpoint.secure
      ? (this.credentials ?? grpc.credentials.createSsl())
      : grpc.credentials.createInsecure();
    let options = this.options;
    if (!endpoint.equals(this.home)) {
      options = { ...options };
      for (const key of HOST_BOUND_OPTIONS) {
        delete options[key];
      }
    }
    return new grpc.Client(endpoint.address, credentials, options);
  }
}

function sslCredentials(tls: TlsOptions): grpc.ChannelCredentials {
  if ((tls.cert === undefined) !== (tls.key === undefined)) {
    throw new TypeError("tls: cert and key go together (a client certificate needs its private key)");
  }
  return grpc.credentials.createSsl(
    pem("tls.ca", tls.ca),
    pem("tls.key", tls.key),
    pem("tls.cert", tls.cert),
  );
}

function pem(field: string, value: string | Buffer | undefined): Buffer | null {
  if (value === undefined) {
    return null;
  }
  if (typeof value === "string") {
    return Buffer.from(value, "utf8");
  }
  if (Buffer.isBuffer(value)) {
    return value;
  }
  throw new TypeError(`${field}: expected PEM text (a string or a Buffer)`);
}

/** Trailing metadata of a refusal made before the call ran: sending it again cannot run it twice. */
export const NOT_RECEIVED_KEY = "cronoq-not-received";
// A message over a size limit, as gRPC words it or as a cronoq server refuses it (the limit's name).
const TOO_LARGE = /message larger than max|limits\.max_message_bytes/i;
// How grpc-js fails a call it never sent: the channel could not connect.
const NOT_CONNECTED = /^No connection established|ECONNREFUSED/;

/**
 * The `ApiError` for a gRPC status, carrying the call's `cronoq-*` trailing metadata, as the Python SDK
 * reads it: a server's `cancelled` (its gRPC core ended a call the server had not taken yet, as its
 * listener closed) is `Unavailable`; a message over a size limit is a `ResourceExhausted` that is not
 * retryable; a call that provably never ran (refused before admission, never connected, or cancelled
 * that way) carries `cronoq-not-received: 1`, so that it is safe to send again even without a key.
 */
export function statusError(status: { code: number; details: string; metadata?: grpc.Metadata }): ApiError {
  const code = STATUS_CODES[status.code] ?? "unknown";
  const details = status.details ?? "";
  let error: ApiError;
  if (code === "cancelled") {
    error = new Unavailable(
      `the server's listener closed before the server took the call (gRPC: ${details || code}); nothing of it ran, retry`,
    );
  } else if (code === "resource_exhausted" && TOO_LARGE.test(details)) {
    error = new ApiError(details, code, false);
  } else {
    error = errorFor(code, details);
  }
  for (const [key, value] of Object.entries(status.metadata?.getMap() ?? {})) {
    if (key.startsWith("cronoq-")) {
      error.metadata[key] = metadataText(value);
    }
  }
  if (code === "cancelled" || (code === "unavailable" && NOT_CONNECTED.test(details))) {
    error.metadata[NOT_RECEIVED_KEY] = "1";
  }
  return error;
}

function metadataText(value: string | Buffer): string {
  return typeof value === "string" ? value : value.toString("utf8");
}

// ------------------------------------------------------------------------------------ shard redirects

const DEFAULT_PORTS: Record<string, number> = { "http:": 80, "https:": 443 };
// A host name as redirectAllow takes it (lower-case already): dot-separated labels, no port.
const HOST_NAME = /^[a-z0-9_-]+(\.[a-z0-9_-]+)*$/;

/** Where a URL connects (scheme, host, port): what redirects are compared by. The host is lower-case
 * without a trailing dot (an IP address in its canonical form, IPv6 without brackets), the port the
 * scheme's default when the URL names none. */
export class Origin {
  constructor(
    readonly scheme: "http" | "https",
    readonly host: string,
    readonly port: number,
  ) {}

  /** A TypeError, saying why, for anything but an `http://` or `https://` URL with a host. */
  static of(url: string): Origin {
    return Origin.ofUrl(splitUrl(url));
  }

  static ofUrl(parts: URL): Origin {
    return new Origin(
      parts.protocol === "https:" ? "https" : "http",
      canonicalHost(parts.hostname),
      parts.port === "" ? (DEFAULT_PORTS[parts.protocol] ?? 0) : Number(parts.port),
    );
  }

  toString(): string {
    const host = this.host.includes(":") ? `[${this.host}]` : this.host;
    return `${this.scheme}://${host}:${this.port}`;
  }
}

/** A shard redirect as received: the URL to go to, and the origins of every URL the server gives that
 * shard (undefined from a server that does not say: a reference server, or an older one). */
export interface Redirect {
  url: string;
  named: ReadonlySet<string> | undefined;
}

/** The redirect of a FAILED_PRECONDITION refusal (trailing metadata first, then initial), if it is one. */
export function shardRedirect(trailing: grpc.Metadata | undefined, initial: grpc.Metadata | undefined): Redirect | undefined {
  const url = metadataValue(SHARD_ENDPOINT_KEY, trailing, initial);
  if (url === undefined) {
    return undefined;
  }
  const listed = metadataValue(SHARD_ENDPOINTS_KEY, trailing, initial);
  return { url, named: listed === undefined ? undefined : origins(listed) };
}

function metadataValue(key: string, ...sources: (grpc.Metadata | undefined)[]): string | undefined {
  for (const metadata of sources) {
    const values = metadata?.get(key) ?? [];
    if (values.length > 0) {
      return metadataText(values[0] as string | Buffer);
    }
  }
  return undefined;
}

/** The origins (as strings) of a comma-separated list of URLs. An entry that is no http(s) URL is left
 * out: it names nowhere a worker could go, and leaving it out only narrows where it may go. */
function origins(listed: string): Set<string> {
  const found = new Set<string>();
  for (const entry of listed.split(",")) {
    try {
      found.add(Origin.of(entry.trim()).toString());
    } catch {
      // not a URL: names nothing
    }
  }
  return found;
}

/** `url` parsed, or a TypeError saying why it is no `http://` or `https://` URL with a host. */
function splitUrl(url: string): URL {
  let parts: URL;
  try {
    parts = new URL(url);
  } catch (err) {
    throw new TypeError(`it is not a valid URL (${(err as Error).message})`);
  }
  if (!(parts.protocol in DEFAULT_PORTS) || parts.hostname === "") {
    throw new TypeError("it is not an http:// or https:// URL with a host");
  }
  return parts;
}

/** A host as origins compare it: lower-case, no trailing dot, an IP address in its canonical form (IPv6
 * without brackets). */
export function canonicalHost(host: string): string {
  let bare = host.toLowerCase().replace(/\.+$/, "");
  if (bare.startsWith("[") && bare.endsWith("]")) {
    bare = bare.slice(1, -1);
  }
  if (isIP(bare) === 6) {
    return new URL(`http://[${bare}]`).hostname.slice(1, -1);
  }
  return bare;
}

/** The host of a gRPC `host:port` address (`[v6]:port` too), canonical; "" when it has none. */
function addressHost(address: string): string {
  try {
    return canonicalHost(new URL(`http://${address}`).hostname);
  } catch {
    return "";
  }
}

/** `localhost` or a loopback IP address: a host whose traffic never leaves this machine, so a token
 * sent to it in the clear is not exposed. Any other name may resolve anywhere. */
export function isLoopbackName(host: string): boolean {
  const bare = canonicalHost(host);
  if (bare === "localhost") {
    return true;
  }
  const version = isIP(bare);
  if (version === 4) {
    return bare.startsWith("127.");
  }
  return version === 6 && bare === "::1";
}

/** One `redirectAllow` entry: an `http(s)://` URL admits that scheme, host and port; a host alone admits
 * it on any port. A host written `*.suffix` stands for every name under `suffix` (not `suffix`
 * itself), kept here as `.suffix`. */
export class AllowedHost {
  constructor(
    readonly host: string,
    readonly scheme?: "http" | "https",
    readonly port?: number,
  ) {}

  /** A TypeError, saying why, for anything else (a bare `*` too: it would admit every host). */
  static parse(entry: string): AllowedHost {
    if (entry.includes("://")) {
      const parts = splitUrl(entry);
      if (parts.username || parts.password || entry.includes("@") || !["", "/"].includes(parts.pathname) || parts.search || parts.hash) {
        throw new TypeError("a URL here names a scheme, host and port, and nothing else");
      }
      const origin = Origin.ofUrl(parts);
      return new AllowedHost(hostPattern(origin.host), origin.scheme, origin.port);
    }
    return new AllowedHost(hostPattern(canonicalHost(entry)));
  }

  admits(origin: Origin): boolean {
    if (this.scheme !== undefined && (this.scheme !== origin.scheme || this.port !== origin.port)) {
      return false;
    }
    if (this.host.startsWith(".")) {
      return origin.host.endsWith(this.host);
    }
    return origin.host === this.host;
  }
}

function hostPattern(host: string): string {
  if (isIP(host) !== 0) {
    return host;
  }
  const name = host.startsWith("*.") ? host.slice(2) : host;
  if (!HOST_NAME.test(name)) {
    throw new TypeError("expected an http:// or https:// URL, a host name, or *.suffix for the names under it");
  }
  return name === host ? name : `.${name}`;
}

/** `redirectAllow` parsed; a TypeError naming the entry that is not one. */
export function allowedHosts(entries: unknown): AllowedHost[] | undefined {
  if (entries === undefined) {
    return undefined;
  }
  if (!Array.isArray(entries)) {
    throw new TypeError(`redirectAllow: expected an array of URLs or host names (got ${JSON.stringify(entries)})`);
  }
  return entries.map((entry: unknown, i) => {
    try {
      if (typeof entry !== "string") {
        throw new TypeError("expected a string");
      }
      return AllowedHost.parse(entry);
    } catch (err) {
      throw new TypeError(`redirectAllow[${i}]: ${(err as Error).message} (got ${JSON.stringify(entry)})`);
    }
  });
}

/**
 * Whether a worker follows a shard redirect, and where to: the Python SDK's rules
 * (docs/sdk-python.md, "Shard redirects"). A redirect comes from the network, so it must not strip
 * TLS, smuggle credentials in the URL, or send the token in the clear to another machine (a loopback
 * URL counts as this machine only when `home` is on it too: a server's loopback address is a port any
 * local program may hold here). And it must lead only where the cluster says its shards are: `named`
 * is the set of URLs `home` last named with a redirect, kept for the life of the worker and replaced
 * only by `home`'s next answer. `allow` (`redirectAllow`), when given, decides alone instead. A server
 * that names nothing (a reference server, or an older one) is followed only to `home`'s own host.
 */
export class Redirects {
  named: ReadonlySet<string> | undefined;

  constructor(
    readonly home: Endpoint,
    readonly sendsToken: boolean,
    readonly allowHttp: boolean = false,
    readonly allow: AllowedHost[] | undefined = undefined,
  ) {}

  /** The endpoint `redirect` (answered by `current`) leads to, or a FailedPrecondition naming the URL
   * and why following it would be unsafe. */
  follow(current: Endpoint, redirect: Redirect): Endpoint {
    const url = redirect.url;
    let parts: URL;
    try {
      parts = splitUrl(url);
    } catch (err) {
      throw refused(url, (err as Error).message);
    }
    if (parts.username || parts.password || /^[a-z]+:\/\/[^/]*@/i.test(url)) {
      throw refused(url, "it carries user information");
    }
    const origin = Origin.ofUrl(parts);
    const secure = origin.scheme === "https";
    if (current.secure && !secure) {
      throw refused(url, "it would downgrade the connection from TLS to plain http");
    }
    if (!secure && this.sendsToken && !this.allowHttp) {
      this.checkPlain(url, origin);
    }
    if (current.equals(this.home) && redirect.named !== undefined) {
      this.named = redirect.named;
    }
    this.checkNamed(url, origin);
    const host = origin.host.includes(":") ? `[${origin.host}]` : origin.host;
    return new Endpoint(`${host}:${origin.port}`, secure);
  }

  /** The token may go over plain http only to this machine, and only when `home` is on it. */
  private checkPlain(url: string, origin: Origin): void {
    if (!isLoopbackName(origin.host)) {
      throw refused(
        url,
        "it would send the token over plain http to another host (pass insecureRedirectHttp: true on trusted networks)",
      );
    }
    if (!isLoopbackName(addressHost(this.home.address))) {
      throw refused(
        url,
        "it would send the token over plain http to a port of this machine, which any local program may " +
          "hold, while the configured target is another host (pass insecureRedirectHttp: true on trusted networks)",
      );
    }
  }

  /** The redirect leads where `allow` admits, else into `named`, else to `home`'s host. */
  private checkNamed(url: string, origin: Origin): void {
    if (this.allow !== undefined) {
      if (!this.allow.some((entry) => entry.admits(origin))) {
        throw refused(url, "redirectAllow does not admit it");
      }
    } else if (this.named !== undefined) {
      if (!this.named.has(origin.toString())) {
        const known = [...this.named].sort().join(", ") || "none";
        throw refused(url, `it is not one of the shard endpoints the configured target named (${known})`);
      }
    } else if (origin.host !== addressHost(this.home.address)) {
      throw refused(
        url,
        "the server named no shard endpoints to check it against (an older or a reference server) and it " +
          "is not the configured target's host; pass redirectAllow: [...] naming the shard endpoints workers may follow",
      );
    }
  }
}

function refused(url: string, why: string): FailedPrecondition {
  return new FailedPrecondition(`refusing shard redirect to ${JSON.stringify(url)}: ${why}`);
}
