# Everyday shell and Python work: under the default seccomp policy none of it may be denied.
set -e
mkdir -p d/e && echo hello > d/e/f.txt && cp -r d d2 && mv d2 d3 && ln -s d3 l && chmod 600 d/e/f.txt && touch -d 2020-01-01 d/e/f.txt
tar czf a.tgz d && mkdir x && tar xzf a.tgz -C x && gzip -k d/e/f.txt && gunzip -c d/e/f.txt.gz >/dev/null
find . -name '*.txt' | sort | xargs md5sum >/dev/null && du -sh . >/dev/null && df -h /tmp >/dev/null && stat d >/dev/null
printf 'b\na\n' | sort | uniq | sed 's/a/A/' | awk '{print $1}' | grep -c . >/dev/null
date >/dev/null; id >/dev/null; uname -a >/dev/null; env >/dev/null; nproc >/dev/null; ps aux >/dev/null
split -b 2 d/e/f.txt part_ && cat part_* >/dev/null && wc -l d/e/f.txt >/dev/null && head -c 10 /dev/urandom | od >/dev/null
python3 - <<'PY'
import multiprocessing, sqlite3, tempfile, subprocess, ctypes, json, os, threading, asyncio, socket, select, mmap, shutil, signal
def sq(x): return x * x
with multiprocessing.Pool(2) as p: assert p.map(sq, range(5)) == [0, 1, 4, 9, 16]
db = sqlite3.connect(":memory:"); db.execute("create table t(a)"); db.execute("insert into t values (1)")
with tempfile.TemporaryDirectory() as t: open(os.path.join(t, "x"), "w").write("x"); shutil.copytree(t, t + "2")
assert subprocess.run(["true"]).returncode == 0
async def main(): await asyncio.sleep(0.01)
asyncio.run(main())
a, b = socket.socketpair(); a.send(b"x"); assert b.recv(1) == b"x"
m = mmap.mmap(-1, 4096); m[0] = 1
q = multiprocessing.Queue(); pr = multiprocessing.Process(target=q.put, args=(1,)); pr.start(); assert q.get() == 1; pr.join()
print("python ok")
PY
echo all-ok
