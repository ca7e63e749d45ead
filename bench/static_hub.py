"""A static Hugging Face-compatible hub for nginx (benchmarks only).

    static_hub.py NGX PORT REPO=NAME:DIR[:CAP_MBPS]...

Writes NGX/www/api/models/REPO/{revision,tree}/..., NGX/nginx.conf (one
server on 127.0.0.1:PORT, every file of DIR under /REPO/resolve/REV/PATH with
the hub's headers; CAP_MBPS: nginx limit_rate per connection), and per repo
NGX/NAME.commit and NGX/NAME.files (path TAB size). Digests are cached in
DIR/../digests-NAME.json by path, size and mtime.
"""
import hashlib, json, os, sys
ngx, port = sys.argv[1], int(sys.argv[2])
LFS = 64 * 1024

def digests(path, cache):
    """(size, git blob sha1, sha256), cached in `cache` by mtime and size."""
    st = os.stat(path)
    try:
        c = json.load(open(cache))
    except Exception:
        c = {}
    key = f"{path}:{st.st_size}:{st.st_mtime_ns}"
    if key not in c:
        g = hashlib.sha1(b"blob %d\0" % st.st_size)
        s = hashlib.sha256()
        with open(path, "rb") as f:
            while b := f.read(1 << 20):
                g.update(b); s.update(b)
        c[key] = [st.st_size, g.hexdigest(), s.hexdigest()]
        json.dump(c, open(cache, "w"))
    return c[key]

locations = []
repos = []
for arg in sys.argv[3:]:
    repo, spec = arg.split("=", 1)
    d, base, *cap = spec.split(":")
    # nginx sends at most sendfile_max_chunk per write and then sleeps for
    # it: with the default 2 MiB chunks a capped connection got ~18 of 20
    # MB/s here, with 256 KiB ~19.4 (one curl, machine under load).
    rate = (f"limit_rate {int(float(cap[0]) * 1e6)};\n        sendfile_max_chunk 256k;\n        "
            if cap else "")
    repos.append((repo, d, base, rate))
for repo, d, base, rate in repos:
    cache = os.path.join(os.path.dirname(os.path.abspath(base)), f"digests-{d}.json")
    files = sorted(os.path.relpath(os.path.join(r, f), base)
                   for r, _, fs in os.walk(base) for f in fs
                   if f != "ready" and not f.startswith("."))
    entries = []
    for p in files:
        size, git, sha = digests(os.path.join(base, p), cache)
        e = {"type": "file", "path": p, "size": size}
        if size >= LFS or p.endswith(".safetensors"):
            ptr = f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha}\nsize {size}\n".encode()
            e["oid"] = hashlib.sha1(b"blob %d\0" % len(ptr) + ptr).hexdigest()
            e["lfs"] = {"oid": sha, "size": size, "pointerSize": len(ptr)}
        else:
            e["oid"] = git
        entries.append(e)
    commit = hashlib.sha1(json.dumps(entries, sort_keys=True).encode()).hexdigest()
    api = os.path.join(ngx, "www/api/models", repo)
    os.makedirs(os.path.join(api, "revision"), exist_ok=True)
    os.makedirs(os.path.join(api, "tree"), exist_ok=True)
    rev = {"id": repo, "modelId": repo, "sha": commit, "private": False,
           "siblings": [{"rfilename": p} for p in files]}
    for r in ("main", commit):
        json.dump(rev, open(os.path.join(api, "revision", r), "w"))
    json.dump(entries, open(os.path.join(api, "tree", commit), "w"))
    # The hub's resolve headers, per file (huggingface_hub needs X-Repo-Commit;
    # ftpipe cross-checks X-Linked-Etag / X-Linked-Size when present).
    for e in entries:
        p = e["path"]
        hdr = rate + f'add_header X-Repo-Commit {commit} always;\n'
        if "lfs" in e:
            hdr += f'        add_header X-Linked-Etag \'"{e["lfs"]["oid"]}"\' always;\n'
            hdr += f'        add_header X-Linked-Size {e["size"]} always;\n'
        for rev_ in (commit, "main"):
            locations.append(
                f'    location = /{repo}/resolve/{rev_}/{p} {{\n'
                f'        alias {os.path.join(base, p)};\n        {hdr}    }}\n')
    open(os.path.join(ngx, d + ".commit"), "w").write(commit)
    open(os.path.join(ngx, d + ".files"), "w").write("\n".join(
        f'{e["path"]}\t{e["size"]}' for e in entries) + "\n")

conf = f"""daemon off;
master_process off;
worker_processes 1;
pid {ngx}/nginx.pid;
error_log {ngx}/error.log warn;
events {{ worker_connections 256; }}
http {{
    types {{ application/json json; }}
    default_type application/octet-stream;
    gzip off;
    sendfile on;
    tcp_nopush on;
    keepalive_requests 10000;
    client_body_temp_path {ngx}/client_body;
    proxy_temp_path {ngx}/proxy;
    fastcgi_temp_path {ngx}/fastcgi;
    uwsgi_temp_path {ngx}/uwsgi;
    scgi_temp_path {ngx}/scgi;
    log_format ranges escape=none '$status\\t$request_method\\t$uri\\trange=$http_range\\tif_range=$http_if_range\\tend=$msec\\tdur=$request_time\\tconn=$connection\\tsent=$body_bytes_sent';
    access_log {ngx}/access.log ranges;
    server {{
        listen 127.0.0.1:{port};
        root {ngx}/www;
        location /api/ {{ default_type application/json; }}
{''.join(locations)}    }}
}}
"""
open(os.path.join(ngx, "nginx.conf"), "w").write(conf)
