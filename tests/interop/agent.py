"""A baton agent written in Python, from the project's .proto alone.

It proves that the Link protocol (baton.v1.Link/Connect) is not Rust-only:
a client generated at run time by grpc_tools.protoc from
proto/proto/baton/v1/link.proto, with no other knowledge of the project,
can be an agent of a real controller. On one stream it

  1. sends Hello (agent id, labels {lang: python}, version, journal id,
     capabilities) and waits for Welcome;
  2. waits for a PackPush, answers PackAck for it, and reports the packs
     it now holds (Held: without it the controller pushes the pack again
     at its next resync, as if the ack had been lost);
  3. sends one FeedbackBatch of three entries (seq 1..3, outcomes OK,
     FAILED, UNKNOWN, for the pushed pack's instructions) and waits for the
     cumulative FeedbackAck of seq 3;
  4. closes its side and waits for the controller to end the stream with
     status OK;

answering every Ping with a Pong meanwhile. It writes what it received to
OUTPUT as JSON and exits 0; on anything else (an unexpected message, an
error status, a timeout) it prints why and exits 1.

Usage: agent.py ADDRESS AGENT_ID OUTPUT [--timeout SECONDS]
ADDRESS is host:port (an http:// prefix is accepted). Needs grpcio and
grpcio-tools (scripts/test.sh installs them in target/pyenv).
"""

import argparse
import importlib
import json
import os
import queue
import re
import sys
import tempfile
import threading
import time

try:
    import grpc
    from grpc_tools import protoc
except ImportError as e:
    sys.exit(
        f"agent.py: {e} (python {sys.executable}): needs grpcio and grpcio-tools; "
        "scripts/test.sh installs them in target/pyenv"
    )

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROTO_ROOT = os.path.join(ROOT, "proto", "proto")
PROTO_FILE = "baton/v1/link.proto"


class Deviation(Exception):
    """The controller did something this agent did not expect."""


def generate(out_dir):
    """Compile link.proto into out_dir and import the generated modules."""
    well_known = os.path.join(os.path.dirname(protoc.__file__), "_proto")
    rc = protoc.main(
        [
            "grpc_tools.protoc",
            f"-I{PROTO_ROOT}",
            f"-I{well_known}",
            f"--python_out={out_dir}",
            f"--grpc_python_out={out_dir}",
            os.path.join(PROTO_ROOT, PROTO_FILE),
        ]
    )
    if rc != 0:
        raise Deviation(f"protoc failed ({rc}) on {PROTO_FILE}")
    sys.path.insert(0, out_dir)
    pb = importlib.import_module("baton.v1.link_pb2")
    rpc = importlib.import_module("baton.v1.link_pb2_grpc")
    return pb, rpc


def instructions_of(yaml):
    """(id, action) of each instruction of a pack, read from its YAML.

    Enough for the packs of the interop test (block or flow entries under a
    top-level `instructions:` key); the real agent uses the pack parser.
    """
    found = []
    inside = False
    item_indent = None
    for line in yaml.splitlines():
        if re.match(r"^instructions:\s*$", line):
            inside = True
            continue
        if inside and re.match(r"^\S", line):
            break
        if not inside:
            continue
        item = re.match(r"^(\s*)-\s", line)
        if item and item_indent is None:
            item_indent = len(item.group(1))
        if item and len(item.group(1)) == item_indent:
            found.append({"id": None, "action": ""})
        if not found:
            continue
        m = re.search(r"(?:^|[\s{,-])id:\s*['\"]?([a-z0-9][a-z0-9._-]*)", line)
        if m and found[-1]["id"] is None:
            found[-1]["id"] = m.group(1)
        m = re.search(r"(?:^|[\s{,-])action:\s*['\"]?([a-z0-9._-]+)", line)
        if m and not found[-1]["action"]:
            found[-1]["action"] = m.group(1)
    return [i for i in found if i["id"]]


def ref_dict(ref):
    return {"tenant": ref.tenant, "pack": ref.pack, "version": ref.version}


class Link:
    """One Link.Connect stream: a queue of messages to send, and a thread
    that reads the controller's messages into another queue."""

    def __init__(self, pb, stub, deadline):
        self.pb = pb
        self.deadline = deadline
        self.outbox = queue.Queue()
        self.inbox = queue.Queue()
        self.pings = 0
        self.call = stub.Connect(self._requests())
        threading.Thread(target=self._read, daemon=True).start()

    def _requests(self):
        while True:
            m = self.outbox.get()
            if m is None:
                return  # half-close: the agent has nothing more to say
            yield m

    def _read(self):
        try:
            for m in self.call:
                self.inbox.put(("message", m))
            self.inbox.put(("end", self.call.code(), self.call.details()))
        except grpc.RpcError as e:
            self.inbox.put(("end", e.code(), e.details()))

    def send(self, **body):
        self.outbox.put(self.pb.AgentMessage(**body))

    def close(self):
        self.outbox.put(None)

    def cancel(self):
        self.call.cancel()

    def _next(self, waiting_for):
        left = self.deadline - time.monotonic()
        try:
            return self.inbox.get(timeout=max(left, 0))
        except queue.Empty:
            raise Deviation(f"timed out waiting for {waiting_for}") from None

    def expect(self, kind):
        """The next controller message that is not a Ping (each Ping is
        answered with a Pong); it must be of oneof case `kind`."""
        while True:
            item = self._next(kind)
            if item[0] == "end":
                _, code, details = item
                raise Deviation(
                    f"waiting for {kind}, the controller ended the stream: {code.name}: {details}"
                )
            m = item[1]
            which = m.WhichOneof("body")
            if which == "ping":
                self.pings += 1
                self.send(pong=self.pb.Pong(id=m.ping.id))
                continue
            if which != kind:
                raise Deviation(f"expected {kind}, got {which}: {m}")
            return getattr(m, kind)

    def expect_end(self):
        """After the half-close: Pings may still come, then the end of the
        stream, which must be status OK."""
        while True:
            item = self._next("the end of the stream")
            if item[0] == "end":
                _, code, details = item
                if code != grpc.StatusCode.OK:
                    raise Deviation(f"stream ended with {code.name}: {details}")
                return code.name
            m = item[1]
            which = m.WhichOneof("body")
            if which != "ping":
                raise Deviation(f"expected the end of the stream, got {which}: {m}")
            self.pings += 1


def feedback_for(pb, push, instructions, base_ns):
    """Three entries for the pushed pack: seq 1..3, outcomes OK, FAILED,
    UNKNOWN, one occurrence a second apart, instructions taken in turn."""
    ref = push.pack
    outcomes = [
        (pb.OUTCOME_OK, "executed", ""),
        (pb.OUTCOME_FAILED, "executed", "line busy (simulated)"),
        (pb.OUTCOME_UNKNOWN, "outcome_unknown", "restarted while running (simulated)"),
    ]
    entries = []
    for i, (outcome, event, detail) in enumerate(outcomes):
        instr = instructions[i % len(instructions)]
        scheduled = base_ns + i * 1_000_000_000
        lateness = 150_000 + i * 10_000
        execution_id = (
            f"{ref.tenant}/{ref.pack}/v{ref.version}/{instr['id']}/{scheduled}/a1"
        )
        entries.append(
            pb.Feedback(
                seq=i + 1,
                execution_id=execution_id,
                pack=pb.PackRef(tenant=ref.tenant, pack=ref.pack, version=ref.version),
                instruction=instr["id"],
                attempt=1,
                scheduled_ns=scheduled,
                actual_ns=scheduled + lateness,
                lateness_ns=lateness,
                outcome=outcome,
                detail=detail,
                event=event,
                action=instr["action"] if event == "executed" else "",
            )
        )
    return entries


def open_channel(address, tls):
    """Plaintext, or mTLS with (cert, key, ca) PEM paths."""
    # Loopback only: never through an http_proxy from the environment.
    options = [("grpc.enable_http_proxy", 0)]
    if tls is None:
        return grpc.insecure_channel(address, options=options)
    cert, key, ca = (open(p, "rb").read() for p in tls)
    creds = grpc.ssl_channel_credentials(
        root_certificates=ca, private_key=key, certificate_chain=cert
    )
    return grpc.secure_channel(address, creds, options=options)


def run(pb, rpc, address, agent_id, timeout, tls=None):
    deadline = time.monotonic() + timeout
    summary = {"agent_id": agent_id, "tls": tls is not None}
    with open_channel(address, tls) as channel:
        try:
            grpc.channel_ready_future(channel).result(timeout=max(deadline - time.monotonic(), 0))
        except grpc.FutureTimeoutError:
            raise Deviation(f"could not connect to {address}") from None
        link = Link(pb, rpc.LinkStub(channel), deadline)
        try:
            link.send(
                hello=pb.Hello(
                    agent_id=agent_id,
                    labels={"lang": "python"},
                    agent_version=f"interop-python/{sys.version_info.major}.{sys.version_info.minor}",
                    capabilities=["gpio.toggle", "gpio.write"],
                    journal_id=f"py-{agent_id}-{time.time_ns()}",
                )
            )
            welcome = link.expect("welcome")
            summary["welcome"] = {
                "agent_id": welcome.agent_id,
                "feedback_acked_seq": welcome.feedback_acked_seq,
                "controller_time_ns": welcome.controller_time_ns,
                "ping_interval_ms": welcome.ping_interval_ms,
            }
            if welcome.agent_id != agent_id:
                raise Deviation(f"welcome for {welcome.agent_id!r}, not {agent_id!r}")
            if welcome.feedback_acked_seq != 0:
                raise Deviation(
                    f"a new journal, yet welcome says seq {welcome.feedback_acked_seq} is stored"
                )

            push = link.expect("pack_push")
            summary["push"] = {"pack": ref_dict(push.pack), "yaml": push.yaml}
            instructions = instructions_of(push.yaml)
            summary["instructions"] = instructions
            if not instructions:
                raise Deviation(f"no instruction ids found in the pushed YAML:\n{push.yaml}")
            link.send(pack_ack=pb.PackAck(pack=push.pack))
            link.send(held=pb.Held(packs=[pb.HeldPack(pack=push.pack, stopped=False)]))

            entries = feedback_for(pb, push, instructions, welcome.controller_time_ns)
            link.send(feedback=pb.FeedbackBatch(entries=entries))
            summary["sent"] = [
                {"seq": e.seq, "execution_id": e.execution_id, "outcome": pb.Outcome.Name(e.outcome)}
                for e in entries
            ]
            ack = link.expect("feedback_ack")
            summary["feedback_ack"] = ack.seq
            if ack.seq != 3:
                raise Deviation(f"feedback acked up to seq {ack.seq}, expected 3")

            link.close()
            summary["end"] = link.expect_end()
            summary["pings_answered"] = link.pings
        except BaseException:
            link.cancel()
            raise
    return summary


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("address", help="controller host:port")
    ap.add_argument("agent_id")
    ap.add_argument("output", help="where the JSON summary goes")
    ap.add_argument("--timeout", type=float, default=30.0, help="overall, in seconds")
    ap.add_argument("--cert", help="mTLS: this agent's certificate (PEM)")
    ap.add_argument("--key", help="mTLS: its private key (PEM)")
    ap.add_argument("--ca", help="mTLS: the fleet's CA (PEM)")
    args = ap.parse_args()
    given = [args.cert, args.key, args.ca]
    if any(given) and not all(given):
        print("agent.py: --cert, --key and --ca go together", file=sys.stderr)
        return 2
    tls = tuple(given) if all(given) else None
    address = re.sub(r"^https?://", "", args.address)

    with tempfile.TemporaryDirectory(prefix="baton-interop-") as gen:
        try:
            pb, rpc = generate(gen)
            summary = run(pb, rpc, address, args.agent_id, args.timeout, tls)
        except Deviation as e:
            print(f"agent.py: {args.agent_id}: {e}", file=sys.stderr)
            return 1
    with open(args.output, "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2)
        f.write("\n")
    print(f"agent.py: {args.agent_id}: done, {summary['feedback_ack']} entries acked")
    return 0


if __name__ == "__main__":
    sys.exit(main())
