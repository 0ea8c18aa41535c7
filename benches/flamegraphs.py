"""Where a request's microseconds go (`python3 benches/run.py --only profile`).

Each server serves a scenario under the usual load (pinned to CPU 0, wrk on CPU 1): first
unprofiled, for its CPU time per request, then under `perf record` (cpu-clock samples with
DWARF call graphs: the release builds keep no frame pointers). The samples become a flamegraph
(inferno; `<target>/flamegraphs/<scenario>-<server>.svg`, beside the folded stacks it was drawn
from) and a table that splits the unprofiled CPU time per request by what the sampled function
belongs to, the raw handler's beside carmy's: so sampling's own overhead changes the shares a
little, never the total. Needs Debian's `linux-perf`; inferno is installed on first use.
"""

import collections
import re
import shutil
import subprocess
import sys
from pathlib import Path

# Samples per second: with 16 KiB of stack copied per sample, more would slow the server
# noticeably; 3 s of load gives a few thousand.
FREQUENCY = 999
STACK_BYTES = 16384
DEFAULT_SCENARIOS = ("execute create_order", "execute, fresh request_id")

# What a sampled function belongs to, by its symbol (the first pattern that matches). Kernel
# frames carry inferno's `_[k]` mark; the allocator and the copies are glibc's.
KERNEL = "kernel, and libc's system calls: sockets, epoll, scheduling"
CATEGORIES = [
    ("clock reads (vDSO)", re.compile(r"clock_gettime|^__vdso")),
    (KERNEL, re.compile(
        r"_\[k\]$|^(__GI_)?_*(libc_)?(writev|recv|recvfrom|send|sendto|epoll_wait|read|write|close|accept4?"
        r"|pthread_\w*asynccancel|syscall)\b")),
    ("allocator (glibc malloc/free)", re.compile(
        r"^(__GI_)?_*(int_|libc_)?(malloc|free|realloc|calloc|cfree)\b|^(tcache|unlink_chunk|malloc_consolidate|arena_)")),
    ("memcpy, memmove, memset, memcmp", re.compile(r"^__(mem|wmem|str)\w*|^(memcpy|memmove|memset|memcmp|bcmp)")),
    ("hyper: HTTP/1 parsing and writing", re.compile(r"^(hyper(_util)?|httparse)::")),
    ("tokio: scheduler, I/O driver, timers", re.compile(r"^tokio(_util)?::|^mio::")),
    ("axum, tower, http: routing, extractors", re.compile(r"^(axum(_core)?|tower(_http|_layer|_service)?|http(_body(_util)?)?|matchit)::")),
    ("serde_json: parsing and writing JSON", re.compile(r"^serde(_json|_core)?::|^(ryu|itoa)::")),
    ("jsonschema: argument validation", re.compile(r"^(jsonschema|referencing|fancy_regex|regex(_automata|_syntax)?)::")),
    ("uuid, sha2, rand: ids and digests", re.compile(r"^(uuid|sha2|rand(_core|_chacha)?|getrandom|digest|block_buffer)::")),
    ("prometheus-client: metrics", re.compile(r"^prometheus_client::")),
    ("tracing: spans and events", re.compile(r"^tracing(_core|_subscriber)?::")),
    ("carmy: gate, execute, runtime, stores", re.compile(r"^carmy::")),
    ("the tools' own code (shop, baseline)", re.compile(r"^(shop|baseline|carmy_benches)::")),
    ("hashing and maps (hashbrown, foldhash, SipHash)", re.compile(r"^(hashbrown|foldhash|indexmap|core::hash|std::hash)::")),
    ("bytes, futures", re.compile(r"^(bytes|futures(_util|_core)?|pin_project\w*)::")),
    ("std, core, alloc (generic code)", re.compile(r"^(std|core|alloc)::")),
]
OTHER = "other"


def category(frame):
    """A frame's category: of the type a generic function works on (`drop_in_place<T>`,
    `<T as Trait>::f`) where the frame names one, else of the function's own path.

    >>> category("core::ptr::drop_in_place<carmy::http::execute::Answer>")
    'carmy: gate, execute, runtime, stores'
    >>> category("<&mut serde_json::de::Deserializer<R> as serde_core::de::Deserializer>::deserialize_any")
    'serde_json: parsing and writing JSON'
    >>> category("<F as axum::handler::Handler<(M,T1),S>>::call::{{closure}}")
    'axum, tower, http: routing, extractors'
    >>> category("tcp_sendmsg_[k]"), category("__GI___writev"), category("__vdso_clock_gettime_[k]")
    ("kernel, and libc's system calls: sockets, epoll, scheduling", "kernel, and libc's system calls: sockets, epoll, scheduling", 'clock reads (vDSO)')
    >>> category("__GI___libc_free"), category("__memmove_avx_unaligned_erms")
    ('allocator (glibc malloc/free)', 'memcpy, memmove, memset, memcmp')
    >>> category("[unknown]")
    'other'
    """
    name = re.sub(r"^(core::ptr::drop_in_place<|<|&|\*const |\*mut |mut |dyn )+", "", frame)
    # `<F as axum::handler::Handler<…>>::call`: a type parameter says nothing; its trait does
    name = re.sub(r"^([A-Z]\w*|\[[^\]]*\]) as ", "", name)
    for label, pattern in CATEGORIES:
        if pattern.search(name):
            return label
    return OTHER


def tools(target):
    """inferno's collapse and flamegraph commands, installed under the target directory."""
    root = Path(target) / "tools"
    collapse, flamegraph = root / "bin" / "inferno-collapse-perf", root / "bin" / "inferno-flamegraph"
    if not collapse.exists():
        subprocess.run(["cargo", "install", "inferno", "--locked", "--root", str(root),
                        "--no-default-features", "--features", "cli"], check=True)
    if not shutil.which("perf"):
        raise RuntimeError("perf not found: install Debian's linux-perf")
    return collapse, flamegraph


def record(pid, seconds, data):
    """Starts `perf record` on `pid` for `seconds`, on CPU 1 beside wrk."""
    return subprocess.Popen(
        ["taskset", "-c", "1", "perf", "record", "-q", "-e", "cpu-clock", "-F", str(FREQUENCY),
         "--call-graph", f"dwarf,{STACK_BYTES}", "-p", str(pid), "-o", str(data),
         "--", "sleep", str(seconds)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def fold(data, collapse):
    """The samples of `data` as inferno's folded stacks, kernel frames marked."""
    script = subprocess.run(["perf", "script", "-i", str(data)], check=True, capture_output=True).stdout
    return subprocess.run([str(collapse), "--all"], input=script, check=True,
                          capture_output=True).stdout.decode()


def shares(folded):
    """Each category's share of the samples, by the function each sample was in, and the CPU
    time sampled (ns: a cpu-clock sample counts its period)."""
    counts, total = collections.Counter(), 0
    for line in folded.splitlines():
        stack, _, count = line.rpartition(" ")
        leaf = stack.rsplit(";", 1)[-1]
        counts[category(leaf)] += int(count)
        total += int(count)
    return {label: count / total for label, count in counts.items()}, total


def flamegraph(folded, flamegraph_bin, title, svg):
    svg.write_bytes(subprocess.run([str(flamegraph_bin), "--title", title, "--width", "1600",
                                    "--countname", "ns of CPU"],
                                   input=folded.encode(), check=True, capture_output=True).stdout)


def report(profiles, servers):
    """`profiles`: scenario -> server -> (CPU µs per request, shares, ns sampled, svg)."""
    lines = []
    for scenario, measured in profiles.items():
        labels = sorted({label for _, shared, _, _ in measured.values() for label in shared},
                        key=lambda label: -max(shared.get(label, 0) * cpu
                                               for cpu, shared, _, _ in measured.values()))
        names = [server for server in servers if server in measured]
        head = " | ".join(f"{name} µs" for name in names)
        lines += [f"### {scenario}\n",
                  "CPU time per request, split by the function each `perf` sample was in "
                  "(self time). The kernel's part, mostly the loopback's delivery of each "
                  "answer into the client's socket on the server's core, is not the server's "
                  "code and moves by a microsecond or more between servers and runs (how much "
                  "work each wake-up finds, page faults of a growing heap): compare user space. "
                  "Flamegraphs: " + ", ".join(f"`{measured[n][3]}`" for n in names) + ".\n",
                  f"| where | {head} | {names[-1]} − {names[0]} µs |",
                  "|---|" + "---:|" * (len(names) + 1)]
        for label in labels:
            values = [measured[name][0] * measured[name][1].get(label, 0) for name in names]
            lines.append(f"| {label} | " + " | ".join(f"{value:.2f}" for value in values)
                         + f" | {values[-1] - values[0]:+.2f} |")
        user = [measured[name][0] * (1 - measured[name][1].get(KERNEL, 0)) for name in names]
        lines.append("| **user space** (all but the kernel) | " + " | ".join(f"**{value:.2f}**" for value in user)
                     + f" | **{user[-1] - user[0]:+.2f}** |")
        totals = [measured[name][0] for name in names]
        lines.append("| **all** | " + " | ".join(f"**{total:.2f}**" for total in totals)
                     + f" | **{totals[-1] - totals[0]:+.2f}** |")
        lines.append("\nCPU time sampled: " + ", ".join(f"{name} {measured[name][2] / 1e6:,.0f} ms"
                                                      for name in names) + "\n")
    return "\n".join(lines)


def profile(args, table, server_class, wrk, target_dir):
    """Profiles each (scenario, server) of `table` once; returns the report."""
    collapse, flamegraph_bin = tools(target_dir)
    out_dir = Path(target_dir) / "flamegraphs"
    out_dir.mkdir(parents=True, exist_ok=True)
    profiles = {}
    for scenario, targets in table.items():
        for target, (method, path, body, headers) in targets.items():
            server = server_class(target)
            try:
                wrk(method, path, body, headers, 1)  # warm-up
                cpu_before = server.cpu_seconds()
                result = wrk(method, path, body, headers, args.seconds)
                cpu = (server.cpu_seconds() - cpu_before) * 1e6 / max(result["requests"], 1)
                data = out_dir / "perf.data"
                recording = record(server.process.pid, args.seconds, data)
                wrk(method, path, body, headers, args.seconds)
                recording.wait()
            finally:
                server.stop()
            folded = fold(data, collapse)
            data.unlink()
            slug = re.sub(r"[^a-z0-9]+", "-", f"{scenario} {target}".lower()).strip("-")
            svg = out_dir / f"{slug}.svg"
            flamegraph(folded, flamegraph_bin, f"{target}: {scenario} ({cpu:.1f} µs CPU per request)", svg)
            svg.with_suffix(".folded").write_text(folded)
            shared, sampled = shares(folded)
            profiles.setdefault(scenario, {})[target] = (cpu, shared, sampled, svg)
            print(f"profile {scenario:32} {target:10} {cpu:.1f} µs/request, {sampled / 1e6:.0f} ms sampled -> {svg}",
                  file=sys.stderr)
    return report(profiles, list(dict.fromkeys(target for targets in table.values() for target in targets)))
