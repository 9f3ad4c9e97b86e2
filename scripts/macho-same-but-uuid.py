"""Exit 0 when two Mach-O files are the same but for their LC_UUID and their LC_CODE_SIGNATURE data.

    python3 scripts/macho-same-but-uuid.py A B HEADERS_A HEADERS_B

HEADERS_* are `llvm-objdump --macho --private-headers` of A and B (scripts/dist passes them). zig's Mach-O
linker writes a random LC_UUID, and the ad-hoc signature hashes the page that holds it, so two builds of the
same commit differ exactly there; everything else must be the same, at the same offsets.
"""
import re
import sys


def layout(text):
    uuid = bytes.fromhex(re.search(r"uuid ([0-9A-Fa-f-]+)", text).group(1).replace("-", ""))
    sig = re.search(r"cmd LC_CODE_SIGNATURE\s+cmdsize \d+\s+dataoff (\d+)\s+datasize (\d+)", text)
    return uuid, int(sig.group(1)), int(sig.group(2))


def main():
    a, b, headers_a, headers_b = sys.argv[1:5]
    (uuid_a, off_a, size_a) = layout(open(headers_a).read())
    (uuid_b, off_b, size_b) = layout(open(headers_b).read())
    x, y = open(a, "rb").read(), open(b, "rb").read()
    at = x.find(uuid_a, 0, 65536)
    if len(x) != len(y) or (off_a, size_a) != (off_b, size_b) or at < 0 or y[at : at + 16] != uuid_b:
        return 1

    def mask(data):
        return data[:at] + bytes(16) + data[at + 16 : off_a] + bytes(size_a) + data[off_a + size_a :]

    return 0 if mask(x) == mask(y) else 1


sys.exit(main())
