"""libkungfu_tf.so carries a private, hidden copy of OpenSSL's libcrypto.

TensorFlow's libtensorflow_framework.so.2 exports BoringSSL under OpenSSL's
names (HMAC, EVP_sha256, RAND_bytes, ...) and is loaded RTLD_GLOBAL, so with a
dynamic ``-lcrypto`` the dynamic linker binds the runtime's calls to BoringSSL
whatever the link order (setup.py explains). These checks fail if the library
imports any such symbol (dynamic linking) or exports one (interposing on
TensorFlow's or anyone else's).
"""

from __future__ import annotations

import re
import subprocess

from conftest import REPO_ROOT

LIBRARY = REPO_ROOT / "kungfu_tf" / "libkungfu_tf.so"
CRYPTO_SYMBOL = re.compile(r"^(HMAC|EVP_|RAND_|CRYPTO_|OPENSSL_|OSSL_|SHA\d|ERR_|BIO_)")


def _dynamic_symbols(path, which: str) -> list[str]:
    out = subprocess.run(["nm", "-D", which, str(path)], capture_output=True, text=True, check=True).stdout
    return [line.split()[-1].split("@")[0] for line in out.splitlines() if line.strip()]


def crypto_linkage_problems(path) -> list[str]:
    """What in ``path``'s dynamic symbol table would let libcrypto calls cross libraries."""
    problems = [f"imports {s}" for s in _dynamic_symbols(path, "--undefined-only") if CRYPTO_SYMBOL.match(s)]
    problems += [f"exports {s}" for s in _dynamic_symbols(path, "--defined-only") if CRYPTO_SYMBOL.match(s)]
    needed = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True, check=True).stdout
    problems += [f"depends on {m}" for m in re.findall(r"\[(libcrypto[^\]]*)\]", needed)]
    return problems


def test_libcrypto_is_linked_in_and_hidden():
    assert LIBRARY.exists(), f"{LIBRARY} is not built (python setup.py build_ext --inplace)"
    assert crypto_linkage_problems(LIBRARY) == []
