"""A C put (guest/include/pfcxl_kvwrite.h) reads its key's window of each host's index segment,
never the whole segment: every other page of the index is made unreadable (mprotect) after the
store is opened, and puts must still work. Before, a put read all of its own segment (a
SIGSEGV here)."""

import random
import subprocess

import pytest

from pfcxl.guest.python import pfcxl_kvstore as kv
from pfcxl.host_tools.image import initramfs

from .conftest import kv_pool


pytestmark = pytest.mark.component

HARNESS = r'''
#define TOOL_NAME "putprobe"
#include "pfcxl_tool.h"
#include "pfcxl_kvstore.h"
#include "pfcxl_kvwrite.h"

/* putprobe POOL HOST SIZE KEY...: open the store as HOST, make every index page unreadable but
 * those holding a window line of the keys, then put each key's block (SIZE bytes of its first
 * byte): one line of kv_put's results. */
int main(int argc, char **argv)
{
    crc_init();
    int fd = open(argv[1], O_RDWR);
    struct stat st;
    fstat(fd, &st);
    char *map = mmap(0, st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    struct kv s;
    const char *why = kv_attach(&s, map + KV_HOME, st.st_size - KV_HOME, atoi(argv[2]));
    if (why || (why = kv_take_lease(&s)))
        die("%s", why);
    kv_recover(&s);
    const uint64_t size = strtoull(argv[3], 0, 10), page = 4096;
    uint8_t d[64][16];
    int keys = argc - 4;
    for (int k = 0; k < keys; k++)
        kv_digest(argv[4 + k], strlen(argv[4 + k]), d[k]);
    uintptr_t lo = ((uintptr_t)(s.base + s.sb.index_off) + page - 1) & ~(page - 1);
    uintptr_t hi = (uintptr_t)(s.base + s.sb.arena_off);
    for (uintptr_t p = lo; p < hi; p += page) {
        int keep = 0;
        for (int k = 0; k < keys && !keep; k++)
            for (int h = 0; h < (int)s.sb.hosts && !keep; h++)
                for (uint32_t w = 0; w < kv_window(&s) && !keep; w++) {
                    uintptr_t line = (uintptr_t)kv_rec(&s, h, kv_probe(&s, d[k], w));
                    keep = line >= p && line < p + page;
                }
        if (!keep && mprotect((void *)p, page, PROT_NONE))
            die("mprotect: %s", strerror(errno));
    }
    char *buf = malloc(size);
    for (int k = 0; k < keys; k++) {
        memset(buf, argv[4 + k][0], size);
        printf("%d ", kv_put(&s, d[k], buf, size, 0));
    }
    printf("\n");
    return 0;
}
'''


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    where = tmp_path_factory.mktemp("putprobe")
    (where / "putprobe.c").write_text(HARNESS)
    include = initramfs.GUEST_SOURCES.parent / "include"
    done = subprocess.run(["gcc", "-O2", "-Wall", "-I", str(include), "-o", str(where / "putprobe"),
                           str(where / "putprobe.c")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return where / "putprobe"


@pytest.mark.parametrize("seed", range(4))
def test_a_c_put_reads_only_its_keys_windows(tmp_path, probe, seed):
    rng = random.Random(seed)
    path = kv_pool(tmp_path, 64 << 20, hosts=4, slots=4096)       # 256 KiB of index per host
    with kv.Store.open(path, host=3) as other:                     # records elsewhere, read by the windows
        for i in range(200):
            other.put(f"other/{i}", bytes([i % 251]) * 512)
    host = rng.randrange(3)
    keys = [f"{chr(97 + rng.randrange(26))}{seed}/{i}" for i in range(20)]
    with kv.Store.open(path, host=host) as s:                      # our own records, learnt at open
        for k in keys[:5]:
            s.put(k, k[0].encode() * 1024)
    done = subprocess.run([str(probe), path, str(host), "1024", *keys, "other/7"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, f"status {done.returncode}: {done.stderr}"
    assert done.stdout.split() == ["0"] * 5 + ["1"] * 15 + ["0"]     # present, stored, someone else's
    with kv.Store.open(path) as s:
        for k in keys:
            assert s.get(k) == k[0].encode() * 1024
        assert s.verify()["bad"] == []
