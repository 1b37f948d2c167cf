#!/usr/bin/env python3
"""A stand-in for the Hugging Face Hub on 127.0.0.1, for tests/unit/test_hub_download.cpp.

Serves model repositories from local folders under the Hub's URL layout and with the headers the
Hub sends:
  GET  /api/models/{repo}/revision/{rev}      {"id", "sha", "siblings": [{"rfilename"}]}
  HEAD|GET /{repo}/resolve/{rev}/{file}       regular file: 200, ETag = git blob sha1
                                              LFS file: 302 to /cdn/{sha256} on another host name
                                              (localhost: a CDN), X-Linked-Etag = sha256,
                                              X-Linked-Size; both carry X-Repo-Commit
  HEAD|GET /cdn/{sha256}                      the LFS bytes, honouring "Range: bytes=N-" (206)
Errors as the Hub words them: 401 + X-Error-Code RepoNotFound for an unknown repository,
404 RevisionNotFound / EntryNotFound, 401 without a token where --token is given.

Knobs for the tests: --token (required as "Authorization: Bearer"), --corrupt FILE (the CDN sends
other bytes than the sha256 it names), --cut FILE:N (the first CDN transfer of FILE stops after N
bytes), --log (one JSON line per request: method, path, authorization, range).
"""
import argparse
import hashlib
import http.server
import json
import os
import sys
import urllib.parse

LFS_SUFFIXES = (".safetensors", ".bin", ".model")


def load_repos(specs):
    repos = {}
    for spec in specs:
        repo_id, folder = spec.split("=", 1)
        files = {}
        for name in sorted(os.listdir(folder)):
            with open(os.path.join(folder, name), "rb") as f:
                files[name] = f.read()
        commit = hashlib.sha1(repo_id.encode()).hexdigest()
        repos[repo_id] = {"commit": commit, "files": files}
    return repos


def lfs_blobs(repos):
    """sha256 -> (file name, bytes) of every LFS file: what the CDN serves."""
    return {hashlib.sha256(data).hexdigest(): (name, data)
            for repo in repos.values() for name, data in repo["files"].items() if name.endswith(LFS_SUFFIXES)}


class Hub(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def record(self):
        if self.server.opts.log:
            with open(self.server.opts.log, "a") as f:
                f.write(json.dumps({"method": self.command, "path": self.path,
                                    "authorization": self.headers.get("Authorization", ""),
                                    "range": self.headers.get("Range", "")}) + "\n")

    def answer(self, status, headers=None, body=b""):
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def error(self, status, code, message):
        self.answer(status, {"X-Error-Code": code, "X-Error-Message": message, "Content-Type": "application/json"},
                    json.dumps({"error": message}).encode())

    def authorised(self):
        want = self.server.opts.token
        if want and self.headers.get("Authorization") != "Bearer " + want:
            self.answer(401, {"Content-Type": "application/json"}, b'{"error":"Invalid credentials"}')
            return False
        return True

    def find(self, rest):
        """Splits "{repo}/{marker}/{rev}/..." for a repo id of one or two parts."""
        for repo_id, repo in self.server.repos.items():
            if rest.startswith(repo_id + "/"):
                return repo_id, repo, rest[len(repo_id) + 1:]
        return None, None, rest

    def revision_ok(self, repo, rev):
        return rev in ("main", repo["commit"])

    def do_HEAD(self):
        self.do_GET()

    def do_GET(self):
        self.record()
        path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
        if path.startswith("/cdn/"):
            return self.cdn(path[len("/cdn/"):])
        if not self.authorised():
            return
        if path.startswith("/api/models/"):
            repo_id, repo, rest = self.find(path[len("/api/models/"):])
            if repo is None:
                return self.error(401, "RepoNotFound", "Repository not found")
            rev = rest[len("revision/"):] if rest.startswith("revision/") else ""
            if not self.revision_ok(repo, rev):
                return self.error(404, "RevisionNotFound", "Invalid rev id: " + rev)
            info = {"id": repo_id, "sha": repo["commit"],
                    "siblings": [{"rfilename": n} for n in repo["files"]]}
            return self.answer(200, {"Content-Type": "application/json"}, json.dumps(info).encode())
        repo_id, repo, rest = self.find(path[1:])
        if repo is None:
            return self.error(401, "RepoNotFound", "Repository not found")
        if not rest.startswith("resolve/"):
            return self.error(404, "EntryNotFound", "not a resolve URL")
        rev, _, name = rest[len("resolve/"):].partition("/")
        if not self.revision_ok(repo, rev):
            return self.error(404, "RevisionNotFound", "Invalid rev id: " + rev)
        if name not in repo["files"]:
            return self.error(404, "EntryNotFound", "Entry not found")
        data = repo["files"][name]
        common = {"X-Repo-Commit": repo["commit"]}
        if name.endswith(LFS_SUFFIXES):
            sha = hashlib.sha256(data).hexdigest()
            return self.answer(302, dict(common, **{"Location": "http://localhost:%d/cdn/%s" % (self.server.server_address[1], sha), "X-Linked-Etag": '"%s"' % sha,
                                                    "X-Linked-Size": str(len(data)), "ETag": '"redirect"'}))
        git_sha = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        self.answer(200, dict(common, **{"ETag": '"%s"' % git_sha}), data)

    def cdn(self, sha):
        if sha not in self.server.blobs:
            return self.answer(404, {}, b"no such object")
        name, data = self.server.blobs[sha]
        if name == self.server.opts.corrupt:
            data = data[:-1] + bytes([data[-1] ^ 0xFF])
        start = 0
        rng = self.headers.get("Range", "")
        if rng.startswith("bytes=") and rng.endswith("-"):
            start = int(rng[len("bytes="):-1])
        cut = self.server.cuts.pop(name, None) if self.command == "GET" else None
        headers = {"Content-Type": "application/octet-stream", "Accept-Ranges": "bytes"}
        if start:
            headers["Content-Range"] = "bytes %d-%d/%d" % (start, len(data) - 1, len(data))
        body = data[start:]
        if cut is None:
            return self.answer(206 if start else 200, headers, body)
        # A transfer that stops: the full length announced, part of it sent, the connection closed.
        headers["Content-Length"] = str(len(body))
        self.send_response(206 if start else 200)
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body[:cut])
        self.wfile.flush()
        self.close_connection = True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repo", action="append", default=[], help="ORG/NAME=FOLDER")
    ap.add_argument("--port-file", required=True)
    ap.add_argument("--token", default="")
    ap.add_argument("--corrupt", default="")
    ap.add_argument("--cut", default="", help="FILE:BYTES")
    ap.add_argument("--log", default="")
    opts = ap.parse_args()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    server.opts = opts
    server.repos = load_repos(opts.repo)
    server.blobs = lfs_blobs(server.repos)
    server.cuts = {}
    if opts.cut:
        name, n = opts.cut.rsplit(":", 1)
        server.cuts[name] = int(n)
    tmp = opts.port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(server.server_address[1]))
    os.rename(tmp, opts.port_file)
    sys.stdout.flush()
    server.serve_forever()


if __name__ == "__main__":
    main()
