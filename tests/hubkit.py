"""Test kit for the Hub tests: real safetensors files, a real Hugging Face cache layout, and a small real HTTP
server on 127.0.0.1 that answers the Hub endpoints kvplan uses as huggingface.co answers them.

What the server answers (from huggingface_hub 2.4's `hf_api.model_info`, `file_download.hf_hub_download`,
`hf_api.parse_safetensors_file_metadata` and `utils._http.hf_raise_for_status`):
- GET /api/models/{repo} and /api/models/{repo}/revision/{rev}: model info JSON with `id`, `sha`, `siblings`;
- HEAD/GET /{repo}/resolve/{rev}/{file}: regular files answer 200 with `X-Repo-Commit`, a quoted git-sha1
  `ETag` and `Content-Length`; LFS files (*.safetensors, *.gguf) answer 302 to /cdn/{sha256} with
  `X-Linked-Etag`, `X-Linked-Size` and `X-Repo-Commit`, and the CDN honours `Range: bytes=a-b` with 206 and
  `Content-Range`; a file too large to hold (`Sparse`: a header, then zeros) is served by ranges only;
- errors as the Hub sends them: 401 `X-Error-Code: RepoNotFound` (no token) / 404 (with a token) for a missing
  or private repo, 401 (no token) / 403 (token without access) `X-Error-Code: GatedRepo` on a gated repo's
  files, 404 `X-Error-Code: RevisionNotFound`, 404 `X-Error-Code: EntryNotFound` (with X-Repo-Commit), and 401
  `X-Error-Message: Invalid credentials in Authorization header` for a token the Hub does not know;
- a repo marked slow waits before answering, to exercise the timeouts.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import struct
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

GOOD_TOKEN = "hf_kvplanTestTokenWithAccess"  # a token the server knows, with access to everything
NO_ACCESS_TOKEN = "hf_kvplanTestTokenNoAccess"  # known, but not granted gated or private repos
BYTES = {"F32": 4, "F16": 2, "BF16": 2, "I32": 4, "I64": 8, "U8": 1, "I8": 1, "F8_E4M3": 1, "BOOL": 1}


# ---------------------------------------------------------------------------------------------- large files


class Sparse:
    """A file of `size` bytes whose first bytes are `head` and the rest zeros (a GGUF of several GB whose
    header alone matters), served by range requests; asking for all of it fails the test."""

    def __init__(self, head: bytes, size: int) -> None:
        self.head, self.size = head, size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, part: slice) -> bytes:
        start, stop, _ = part.indices(self.size)
        if stop - start > 64 * 2**20:
            raise AssertionError(f"{stop - start:,} bytes asked of a {self.size:,}-byte file")
        return self.head[start:stop] + bytes(max(0, stop - max(start, len(self.head))))


def sha256_of(data) -> str:
    return hashlib.sha256(data.head + str(data.size).encode() if isinstance(data, Sparse) else data).hexdigest()


# ---------------------------------------------------------------------------------------------- safetensors


def safetensors_file(tensors: dict[str, tuple[str, list[int]]]) -> bytes:
    """A real safetensors file: 8-byte little-endian header length, the JSON header (dtype, shape,
    data_offsets per tensor, then __metadata__), padded with spaces to 8 bytes, then the zero tensor data."""
    header: dict = {}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        size = math.prod(shape) * BYTES[dtype]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    header["__metadata__"] = {"format": "pt"}
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + bytes(offset)


def tensor_bytes(data: bytes) -> int:
    """Bytes of tensor data a safetensors file holds, from its header's data_offsets."""
    (size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + size])
    return sum(t["data_offsets"][1] - t["data_offsets"][0] for k, t in header.items() if k != "__metadata__")


# A made-up Llama: 2 layers, hidden 64, 4 heads of 16 (2 KV heads), MLP 128, vocab 256, untied, bf16.
TINY_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 256,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "rms_norm_eps": 1e-5,
    "auto_map": {"AutoModelForCausalLM": "modeling_evil.EvilModel"},
}


def tiny_tensors(layers: range = range(2), dtype: str = "BF16", embed: bool = True, head: bool = True):
    """The made-up Llama's tensors, as transformers names and shapes them ([out, in] for linears)."""
    out: dict[str, tuple[str, list[int]]] = {}
    if embed:
        out["model.embed_tokens.weight"] = (dtype, [256, 64])
    for i in layers:
        p = f"model.layers.{i}."
        out |= {
            p + "self_attn.q_proj.weight": (dtype, [64, 64]),
            p + "self_attn.k_proj.weight": (dtype, [32, 64]),
            p + "self_attn.v_proj.weight": (dtype, [32, 64]),
            p + "self_attn.o_proj.weight": (dtype, [64, 64]),
            p + "mlp.gate_proj.weight": (dtype, [128, 64]),
            p + "mlp.up_proj.weight": (dtype, [128, 64]),
            p + "mlp.down_proj.weight": (dtype, [64, 128]),
            p + "input_layernorm.weight": (dtype, [64]),
            p + "post_attention_layernorm.weight": (dtype, [64]),
        }
    if head:
        out["model.norm.weight"] = (dtype, [64])
        out["lm_head.weight"] = (dtype, [256, 64])
    return out


def sharded(shards: dict[str, dict[str, tuple[str, list[int]]]]) -> dict[str, bytes]:
    """Shard files plus model.safetensors.index.json naming them in its weight_map."""
    files = {name: safetensors_file(tensors) for name, tensors in shards.items()}
    index = {
        "metadata": {"total_size": sum(tensor_bytes(b) for b in files.values())},
        "weight_map": {t: name for name, tensors in shards.items() for t in tensors},
    }
    return {**files, "model.safetensors.index.json": json.dumps(index).encode()}


def gptq_tensors(group: int = 32):
    """The made-up Llama as a GPTQ 4-bit checkpoint: each linear [out, in] becomes qweight I32 [in/8, out],
    qzeros I32 [in/group, out/8], scales F16 [in/group, out], g_idx I32 [in]; the rest F16."""
    out: dict[str, tuple[str, list[int]]] = {"model.embed_tokens.weight": ("F16", [256, 64])}
    for i in range(2):
        p = f"model.layers.{i}."
        for name, (o, n) in {
            "self_attn.q_proj": (64, 64),
            "self_attn.k_proj": (32, 64),
            "self_attn.v_proj": (32, 64),
            "self_attn.o_proj": (64, 64),
            "mlp.gate_proj": (128, 64),
            "mlp.up_proj": (128, 64),
            "mlp.down_proj": (64, 128),
        }.items():
            out |= {
                p + name + ".qweight": ("I32", [n // 8, o]),
                p + name + ".qzeros": ("I32", [n // group, o // 8]),
                p + name + ".scales": ("F16", [n // group, o]),
                p + name + ".g_idx": ("I32", [n]),
            }
        out |= {
            p + "input_layernorm.weight": ("F16", [64]),
            p + "post_attention_layernorm.weight": ("F16", [64]),
        }
    out |= {"model.norm.weight": ("F16", [64]), "lm_head.weight": ("F16", [256, 64])}
    return out


GPTQ_CONFIG = TINY_CONFIG | {
    "torch_dtype": "float16",
    "quantization_config": {
        "quant_method": "gptq",
        "bits": 4,
        "group_size": 32,
        "desc_act": False,
        "sym": True,
    },
}


# ---------------------------------------------------------------------------------------------- HF cache


def commit_of(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()


def git_blob_sha1(data) -> str:
    if isinstance(data, Sparse):
        return hashlib.sha1(b"sparse %d\0" % len(data) + data.head).hexdigest()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def put_in_cache(
    hub_cache: Path, repo_id: str, commit: str, files: dict[str, bytes], refs: tuple[str, ...] = ("main",)
) -> Path:
    """Files laid out as huggingface_hub caches them: models--org--name/blobs/<etag>,
    snapshots/<commit>/<file> -> ../../blobs/<etag> (relative symlinks), refs/<ref> holding the commit."""
    repo = hub_cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True, exist_ok=True)
    (repo / "blobs").mkdir(exist_ok=True)
    for name, data in files.items():
        etag = hashlib.sha256(data).hexdigest() if name.endswith((".safetensors", ".gguf")) else git_blob_sha1(data)
        (repo / "blobs" / etag).write_bytes(data)
        link = snapshot / name
        link.unlink(missing_ok=True)
        link.symlink_to(Path("..") / ".." / "blobs" / etag)
    (repo / "refs").mkdir(exist_ok=True)
    for ref in refs:
        (repo / "refs" / ref).write_text(commit)  # no newline: huggingface_hub reads the file as is
    return snapshot


# ---------------------------------------------------------------------------------------------- environment


def hub_environment(
    monkeypatch,
    home: Path,
    endpoint: str | None = None,
    offline: bool = False,
    etag_timeout: int | None = None,
    download_timeout: int | None = None,
) -> dict[str, str]:
    """Point huggingface_hub at `home` (HF_HOME) and `endpoint` (HF_ENDPOINT), for this process and for the
    subprocesses it starts: the environment variables are set, and huggingface_hub.constants, which reads them
    once at import, gets the values it would have computed from them. No token is inherited."""
    env = {"HF_HOME": str(home), "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_XET": "1"}
    if endpoint:
        env["HF_ENDPOINT"] = endpoint
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    if etag_timeout:
        env["HF_HUB_ETAG_TIMEOUT"] = str(etag_timeout)
    if download_timeout:
        env["HF_HUB_DOWNLOAD_TIMEOUT"] = str(download_timeout)
    for name in (
        "HF_TOKEN",
        "HUGGING_FACE_HUB_TOKEN",
        "HF_HUB_CACHE",
        "HF_ASSETS_CACHE",
        "HF_TOKEN_PATH",
        "HF_HUB_OFFLINE",
        "TRANSFORMERS_OFFLINE",
        "HF_ENDPOINT",
        "HF_HUB_ETAG_TIMEOUT",
        "HF_HUB_DOWNLOAD_TIMEOUT",
        "HF_OIDC_RESOURCE",
    ):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    from huggingface_hub import constants

    url = (endpoint or "https://huggingface.co").rstrip("/")
    patches = {
        "HF_HOME": str(home),
        "HF_HUB_CACHE": str(home / "hub"),
        "HF_ASSETS_CACHE": str(home / "assets"),
        "HF_TOKEN_PATH": str(home / "token"),
        "HF_STORED_TOKENS_PATH": str(home / "stored_tokens"),
        "HF_HUB_OFFLINE": offline,
        "ENDPOINT": url,
        "HUGGINGFACE_CO_URL_TEMPLATE": url + "/{repo_id}/resolve/{revision}/{filename}",
        "HF_HUB_ETAG_TIMEOUT": etag_timeout or constants.DEFAULT_ETAG_TIMEOUT,
        "HF_HUB_DOWNLOAD_TIMEOUT": download_timeout or constants.DEFAULT_DOWNLOAD_TIMEOUT,
        "HF_HUB_DISABLE_XET": True,
    }
    for name, value in patches.items():
        monkeypatch.setattr(constants, name, value)
    return {**os.environ}


# ---------------------------------------------------------------------------------------------- the server


@dataclass
class Repo:
    files: dict[str, bytes]
    commit: str
    branches: dict[str, str] = field(default_factory=dict)
    gated: bool = False
    private: bool = False
    slow: float = 0.0  # seconds to wait before answering anything about this repo
    status: int | None = None  # answer every request about this repo with this status (503: the Hub is down)

    def resolve(self, rev: str) -> str | None:
        if rev in self.branches:
            return self.branches[rev]
        if rev in ("main", self.commit):
            return self.commit
        return None


class QuietServer(ThreadingHTTPServer):
    """A client that drops its connection mid-answer (kvplan, having read the bytes it refuses) is not an error of
    the server: socketserver would print a traceback to sys.stderr, which the tests capture as kvplan's own."""

    def handle_error(self, request, client_address) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class FakeHub:
    """A ThreadingHTTPServer on 127.0.0.1 (any free port) answering as the Hub does; `requests` logs
    (method, path, range header, authorization present) of every request."""

    def __init__(self) -> None:
        self.repos: dict[str, Repo] = {}
        self.requests: list[tuple[str, str, str | None, bool]] = []
        self.cdn_files: dict[str, bytes] = {}
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                hub.handle(self, head=False)

            def do_HEAD(self) -> None:
                hub.handle(self, head=True)

        # The Hub, and its LFS CDN on another origin (another port), as huggingface.co and its CDN are: a HEAD
        # is not followed off the Hub, so the file metadata comes from the 302 itself.
        self.servers = [QuietServer(("127.0.0.1", 0), Handler) for _ in range(2)]
        self.url, self.cdn_url = (f"http://127.0.0.1:{s.server_address[1]}" for s in self.servers)
        for server in self.servers:
            server.daemon_threads = True
            threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()

    def close(self) -> None:
        for server in self.servers:
            server.shutdown()
            server.server_close()

    def add(self, repo_id: str, files: dict[str, bytes], **kwargs) -> Repo:
        commit = kwargs.pop("commit", None) or commit_of(repo_id + json.dumps(sorted(files)))
        self.repos[repo_id] = Repo(files=files, commit=commit, **kwargs)
        return self.repos[repo_id]

    def count(self, method: str, pattern: str) -> int:
        return sum(1 for m, path, _, _ in self.requests if m == method and re.search(pattern, path))

    # -- answering

    def handle(self, req: BaseHTTPRequestHandler, head: bool) -> None:
        path = urlsplit(req.path).path
        auth = req.headers.get("authorization")
        self.requests.append((req.command, path, req.headers.get("range"), auth is not None))
        token = auth.removeprefix("Bearer ").strip() if auth else None
        if token is not None and token not in (GOOD_TOKEN, NO_ACCESS_TOKEN):
            return self.error(req, head, 401, None, "Invalid credentials in Authorization header")
        if path.startswith("/cdn/"):
            return self.cdn(req, head, path.removeprefix("/cdn/"))
        api = re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/(.+))?", path)
        resolve = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        match = api or resolve
        if match is None:
            return self.error(req, head, 404, None, "Not found")
        repo_id, rev = match.group(1), unquote(match.group(2) or "main")
        repo = self.repos.get(repo_id)
        if repo is not None and repo.slow:
            time.sleep(repo.slow)
        if repo is not None and repo.status:
            return self.error(req, head, repo.status, None, "Service Unavailable")
        if repo is None or (repo.private and token != GOOD_TOKEN):
            return self.error(req, head, 404 if token else 401, "RepoNotFound", "Repository not found")
        commit = repo.resolve(rev)
        if commit is None:
            return self.error(req, head, 404, "RevisionNotFound", f"Invalid rev id: {rev}")
        if api:
            return self.model_info(req, head, repo_id, repo, commit)
        if repo.gated and token != GOOD_TOKEN:
            if token is None:
                return self.error(
                    req,
                    head,
                    401,
                    "GatedRepo",
                    f"Access to model {repo_id} is restricted. You must "
                    "have access to it and be authenticated to access it. Please log in.",
                )
            return self.error(
                req,
                head,
                403,
                "GatedRepo",
                f"Access to model {repo_id} is restricted and you are "
                f"not in the authorized list. Visit https://huggingface.co/{repo_id} to ask for access.",
            )
        filename = unquote(resolve.group(3))
        data = repo.files.get(filename)
        if data is None:
            return self.error(req, head, 404, "EntryNotFound", "Entry not found", {"X-Repo-Commit": commit})
        if filename.endswith((".safetensors", ".gguf")):  # LFS: redirect to the CDN, metadata in X-Linked-*
            sha256 = sha256_of(data)
            self.cdn_files[sha256] = data
            return self.send(
                req,
                head,
                302,
                b"",
                {
                    "Location": f"{self.cdn_url}/cdn/{sha256}",
                    "X-Repo-Commit": commit,
                    "X-Linked-Etag": f'"{sha256}"',
                    "X-Linked-Size": str(len(data)),
                    "ETag": f'"{git_blob_sha1(data)}"',
                },
            )
        return self.file(req, head, data, {"X-Repo-Commit": commit, "ETag": f'"{git_blob_sha1(data)}"'})

    def cdn(self, req, head: bool, sha256: str) -> None:
        data = self.cdn_files.get(sha256)
        if data is None:
            return self.send(req, head, 404, b"not found", {})
        return self.file(req, head, data, {"ETag": f'"{sha256}"'})

    def file(self, req, head: bool, data: bytes, headers: dict[str, str]) -> None:
        wanted = re.fullmatch(r"bytes=(\d+)-(\d*)", req.headers.get("range") or "")
        if wanted and not head:
            start = int(wanted.group(1))
            end = min(int(wanted.group(2)) if wanted.group(2) else len(data) - 1, len(data) - 1)
            if start >= len(data):
                return self.send(req, head, 416, b"", {"Content-Range": f"bytes */{len(data)}"})
            return self.send(
                req,
                head,
                206,
                data[start : end + 1],
                {**headers, "Content-Range": f"bytes {start}-{end}/{len(data)}", "Accept-Ranges": "bytes"},
            )
        return self.send(req, head, 200, data, {**headers, "Accept-Ranges": "bytes"})

    def model_info(self, req, head: bool, repo_id: str, repo: Repo, commit: str) -> None:
        body = {
            "_id": commit_of(repo_id)[:24],
            "id": repo_id,
            "modelId": repo_id,
            "author": repo_id.split("/")[0],
            "sha": commit,
            "private": repo.private,
            "gated": "manual" if repo.gated else False,
            "disabled": False,
            "tags": ["safetensors"],
            "lastModified": "2025-01-01T00:00:00.000Z",
            "siblings": [{"rfilename": name} for name in sorted(repo.files)],
        }
        return self.send(req, head, 200, json.dumps(body).encode(), {"Content-Type": "application/json"})

    def error(
        self,
        req,
        head: bool,
        status: int,
        code: str | None,
        message: str,
        headers: dict[str, str] | None = None,
    ) -> None:
        extra = {"X-Error-Message": message, "Content-Type": "application/json", **(headers or {})}
        if code:
            extra["X-Error-Code"] = code
        return self.send(req, head, status, json.dumps({"error": message}).encode(), extra)

    @staticmethod
    def send(req, head: bool, status: int, body: bytes, headers: dict[str, str]) -> None:
        try:
            req.send_response(status)
            for name, value in headers.items():
                req.send_header(name, value)
            req.send_header("Content-Length", str(len(body)))
            req.end_headers()
            if not head:
                req.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (a timeout test)
