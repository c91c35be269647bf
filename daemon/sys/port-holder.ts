// Who holds a TCP port on this node: the listening socket in /proc/net/tcp{,6} (this network namespace),
// then the process with that socket among its file descriptors. Used to say why a port cannot be opened
// (a health-check port kube-proxy already answers, say). Best effort: undefined when it cannot be told.
import { readFileSync, readdirSync, readlinkSync } from 'node:fs';

const LISTEN = '0A';

/** The inodes of sockets listening on TCP `port` (IPv4 and IPv6) in this network namespace. */
export function listeningInodes(port: number, procNet = '/proc/net'): Set<string> {
  const out = new Set<string>();
  for (const file of ['tcp', 'tcp6']) {
    let text: string;
    try {
      text = readFileSync(`${procNet}/${file}`, 'utf8');
    } catch {
      continue;
    }
    for (const line of text.split('\n').slice(1)) {
      // sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
      const f = line.trim().split(/\s+/);
      if (f.length < 10 || f[3] !== LISTEN) continue;
      const local = f[1].split(':');
      if (parseInt(local[local.length - 1], 16) === port) out.add(f[9]);
    }
  }
  return out;
}

/** The process listening on TCP `port` (its comm and pid), or undefined when none is found. */
export function portHolder(port: number, proc = '/proc'): { name: string; pid: number } | undefined {
  const inodes = listeningInodes(port, `${proc}/net`);
  if (!inodes.size) return undefined;
  const wanted = new Set([...inodes].map((i) => `socket:[${i}]`));
  for (const pid of readdirSync(proc)) {
    if (!/^\d+$/.test(pid)) continue;
    let fds: string[];
    try {
      fds = readdirSync(`${proc}/${pid}/fd`);
    } catch {
      continue; // gone, or not ours to read
    }
    for (const fd of fds) {
      let link: string;
      try {
        link = readlinkSync(`${proc}/${pid}/fd/${fd}`);
      } catch {
        continue;
      }
      if (!wanted.has(link)) continue;
      let name = '?';
      try {
        name = readFileSync(`${proc}/${pid}/comm`, 'utf8').trim();
      } catch {
        // exited meanwhile
      }
      return { name, pid: Number(pid) };
    }
  }
  return undefined;
}
