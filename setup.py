"""Build script for kungfu_tf.

Builds two kinds of generated artefacts:

* ``kungfu_tf/libkungfu_tf.so``: ALL of ops/runtime/*.cc and ops/kernels/*.cc
  compiled with g++ against the installed TensorFlow into one shared library
  (load it with ``tf.load_op_library``). Objects are cached under build/obj/
  and only recompiled when the source, a header it includes (tracked with
  g++ -MMD), or the compile command changes; files compile 2 at a time
  (override with KUNGFU_BUILD_JOBS, the compiler with CXX).
* ``kungfu_tf/proto/*_pb2.py, *_pb2_grpc.py``: Python stubs for every
  proto/*.proto, generated with grpc_tools.protoc.

Ways to build:

* ``make install``: developer install: ``pip install --no-build-isolation -e .``
  into .venv (with KUNGFU_SKIP_EXT_BUILD=1), then ``python setup.py build_ext
  --inplace``, which ``make test`` re-runs whenever a source changes. The .so
  and the stubs land in the source tree (kungfu_tf/).
* ``pip install .``: a regular install; pyproject.toml declares the build
  requirements (TensorFlow included) so this works from a clean clone.

TensorFlow and grpc_tools are imported lazily, so computing metadata does not
need them.
"""

import concurrent.futures
import glob
import importlib.metadata
import os
import re
import shlex
import subprocess
import sys
import threading

from setuptools import Extension, find_namespace_packages, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

ROOT = os.path.dirname(os.path.abspath(__file__))
SO_NAME = "libkungfu_tf.so"
EXT_NAME = "kungfu_tf.libkungfu_tf"
OBJ_DIR = os.path.join("build", "obj")
PROTO_DIR = "proto"
PROTO_OUT = os.path.join("kungfu_tf", "proto")

# The optional extra `ray` (kungfu-run --ray): the version pinned in
# constraints.txt, which `make install` installs (requirements.txt).
RAY_REQUIREMENT = "ray==2.60.0"

CXXFLAGS = ["-std=c++17", "-O2", "-fPIC", "-pthread", "-Wall", "-Wextra"]
LDFLAGS = ["-shared", "-pthread"]


def libcrypto_link_flags(cxx):
    """Flags that link OpenSSL's libcrypto.a into the .so with hidden symbols.

    libtensorflow_framework.so.2 exports BoringSSL's symbols (HMAC,
    EVP_sha256, RAND_bytes, OPENSSL_cleanse, ...) unversioned, and TensorFlow
    loads it RTLD_GLOBAL. With a dynamic -lcrypto, the dynamic linker binds our
    references to those BoringSSL copies whatever the link order (OpenSSL's
    versioned references accept an unversioned definition), mixing two
    libraries' structures. Linked statically and hidden (--exclude-libs), our
    calls resolve inside the .so at link time and nothing is exported. The
    archive must come before TensorFlow's flags on the link line: otherwise
    the linker resolves against TensorFlow's exports first.

    Raises:
        SystemExit: if libcrypto.a is missing (Debian's libssl-dev).
    """
    out = subprocess.run(
        cxx + ["-print-file-name=libcrypto.a"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    if not os.path.isabs(out) or not os.path.exists(out):
        raise SystemExit(
            "error: libcrypto.a (OpenSSL 3) not found: install Debian's libssl-dev "
            "(`make install` does; or apt-get install libssl-dev)"
        )
    return ["-Wl,--exclude-libs,libcrypto.a", out, "-ldl"]


def require_xxhash_header(cxx):
    """Stops with a clear error when xxhash.h (Debian's libxxhash-dev) is missing.

    ops/runtime/state_pieces.cc compiles xxHash's header in (XXH3-128, the
    elastic state digest): without this check the build would fail deep in
    a compiler error.

    Raises:
        SystemExit: if the compiler cannot find xxhash.h.
    """
    probe = subprocess.run(
        cxx + ["-x", "c++", "-E", "-", "-o", os.devnull],
        input="#include <xxhash.h>\n",
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.returncode != 0:
        raise SystemExit(
            "error: xxhash.h not found: install Debian's libxxhash-dev "
            "(`make install` does; or apt-get install libxxhash-dev)"
        )


def _rel(*patterns):
    """Sorted paths (relative to ROOT) matching the glob patterns."""
    out = set()
    for p in patterns:
        out.update(os.path.relpath(f, ROOT) for f in glob.glob(os.path.join(ROOT, p)))
    return sorted(out)


def cc_sources():
    return _rel("ops/runtime/*.cc", "ops/kernels/*.cc")


def cc_headers():
    return _rel("ops/runtime/*.h", "ops/kernels/*.h")


# --------------------------------------------------------------------------
# Protobuf / gRPC stubs
# --------------------------------------------------------------------------

_IMPORT_RE = re.compile(r"^import (\w+_pb2) as (\w+)$", re.MULTILINE)


def generate_protos(verbose=True):
    """Generates kungfu_tf/proto/<name>_pb2{,_grpc}.py{,i} for proto/*.proto.

    Skipped when every output is newer than every .proto (an import between
    .proto files can change any output, so all are regenerated together).
    """
    protos = _rel(os.path.join(PROTO_DIR, "*.proto"))
    if not protos:
        return
    outputs = []
    for p in protos:
        stem = os.path.join(ROOT, PROTO_OUT, os.path.splitext(os.path.basename(p))[0])
        outputs += [stem + "_pb2.py", stem + "_pb2_grpc.py", stem + "_pb2.pyi"]
    newest_input = max(os.path.getmtime(os.path.join(ROOT, p)) for p in protos)
    if all(os.path.exists(o) and os.path.getmtime(o) >= newest_input for o in outputs):
        return

    import grpc_tools  # lazily: only needed when building

    well_known = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    cmd = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        f"-I{PROTO_DIR}",
        f"-I{well_known}",
        f"--python_out={PROTO_OUT}",
        f"--pyi_out={PROTO_OUT}",
        f"--grpc_python_out={PROTO_OUT}",
    ] + [os.path.relpath(p, PROTO_DIR) for p in protos]
    if verbose:
        print("generating proto stubs:", " ".join(protos), flush=True)
    os.makedirs(os.path.join(ROOT, PROTO_OUT), exist_ok=True)
    subprocess.run(cmd, cwd=ROOT, check=True)
    # protoc emits `import config_pb2 as config__pb2` (a top-level import);
    # make those imports package-relative so kungfu_tf.proto is self-contained.
    for o in outputs:
        if o.endswith(".py"):
            with open(o) as f:
                text = f.read()
            fixed = _IMPORT_RE.sub(r"from . import \1 as \2", text)
            if fixed != text:
                with open(o, "w") as f:
                    f.write(fixed)
        os.utime(o)  # outputs newer than inputs, even if unchanged


def runtime_requirement(name):
    """`name` (protobuf or grpcio) with the bounds that our protoc needs.

    Generated stubs refuse to import with an older protobuf runtime or grpcio
    than the grpcio-tools that generated them, so we require what grpcio-tools
    itself requires (e.g. protobuf>=7.35.1,<8 and grpcio>=1.85.1).
    """
    try:
        for req in importlib.metadata.requires("grpcio-tools") or []:
            m = re.match(rf"{name}\s*([<>=!~][^;]*)$", req)
            if m:
                return name + m.group(1).replace(" ", "")
    except importlib.metadata.PackageNotFoundError:
        pass
    return name


# --------------------------------------------------------------------------
# The shared library
# --------------------------------------------------------------------------


def _run_quiet(cmd):
    r = subprocess.run(
        cmd,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        check=False,
    )
    return r.returncode, r.stdout


def _read_deps(dep_file):
    """Files listed in a g++ -MMD dependency file (the object's inputs)."""
    with open(dep_file) as f:
        text = f.read().replace("\\\n", " ")
    first_rule = text.split("\n", 1)[0]
    _, _, deps = first_rule.partition(": ")
    return deps.split()


class BuildExt(build_ext):
    """Compiles the op library with g++ (not the distutils compiler driver)."""

    def get_ext_filename(self, fullname):
        if fullname.split(".")[-1] == EXT_NAME.split(".")[-1]:
            # libkungfu_tf.so, not libkungfu_tf.cpython-311-x86_64-linux-gnu.so
            return os.path.join(*fullname.split(".")[:-1], SO_NAME)
        return super().get_ext_filename(fullname)

    def run(self):
        generate_protos()
        if os.environ.get("KUNGFU_SKIP_EXT_BUILD") == "1":
            # The Makefile's editable install: it builds the .so itself right
            # after, with `setup.py build_ext --inplace` (plain compiler output
            # instead of pip's, and no pip re-run after a C++ error).
            print(f"KUNGFU_SKIP_EXT_BUILD=1: not building {SO_NAME}", flush=True)
            return
        super().run()

    def build_extension(self, ext):
        if ext.name != EXT_NAME:
            return super().build_extension(ext)
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # quiet TF import
        import tensorflow as tf  # lazily: only needed when building

        cxx = shlex.split(os.environ.get("CXX", "g++"))
        jobs = max(1, int(os.environ.get("KUNGFU_BUILD_JOBS", "2")))
        tf_include = tf.sysconfig.get_include()
        tf_lib = tf.sysconfig.get_lib()
        compile_flags = []
        for flag in tf.sysconfig.get_compile_flags():
            # TF headers as system headers: no -Wall/-Wextra noise from them,
            # and -MMD does not list (and re-stat) thousands of TF headers.
            if flag == "-I" + tf_include:
                compile_flags += ["-isystem", tf_include]
            else:
                compile_flags.append(flag)
        # Kernels may include runtime headers as "socket_io.h" or
        # "ops/runtime/socket_io.h".
        includes = ["-I.", "-Iops/runtime"]
        # Only the TF *version* enters the cache key, not the path to TF, so
        # objects survive pip's per-build temporary build environments.
        key_subst = [(tf_include, "<tf-include>"), (tf_lib, "<tf-lib>")]
        key_suffix = f"tensorflow=={tf.__version__}"

        def cache_key(cmd):
            s = shlex.join(cmd)
            for path, token in key_subst:
                s = s.replace(path, token)
            return f"{s}\n{key_suffix}\n"

        require_xxhash_header(cxx)
        sources = list(ext.sources)
        objects, todo = [], []
        for src in sources:
            obj = os.path.join(OBJ_DIR, os.path.splitext(src)[0] + ".o")
            dep, keyf = obj[:-2] + ".d", obj[:-2] + ".key"
            cmd = (
                cxx
                + CXXFLAGS
                + compile_flags
                + includes
                + ["-MMD", "-MF", dep, "-c", src, "-o", obj]
            )
            objects.append(obj)
            if self.force or not self._object_fresh(obj, dep, keyf, cache_key(cmd)):
                todo.append((src, obj, keyf, cmd))

        if todo:
            # Slowest first (TF kernels, ~30-60 s each) so the jobs finish together.
            todo.sort(key=lambda item: not item[0].startswith("ops/kernels/"))
            print(
                f"compiling {len(todo)} of {len(sources)} C++ files ({jobs} jobs)",
                flush=True,
            )
            self._compile_all(todo, cache_key, jobs)

        out = os.path.abspath(self.get_ext_fullpath(ext.name))
        crypto_flags = libcrypto_link_flags(cxx)
        link_cmd = (
            cxx
            + LDFLAGS
            + ["-o", out]
            + objects
            + crypto_flags
            + list(tf.sysconfig.get_link_flags())
        )
        # A security update of libssl-dev replaces libcrypto.a: relink then.
        link_key = (
            cache_key(link_cmd)
            + f"libcrypto.a mtime {os.path.getmtime(crypto_flags[1])}\n"
        )
        link_keyf = os.path.join(OBJ_DIR, "link.key")
        newest_obj = max(
            (os.path.getmtime(os.path.join(ROOT, o)) for o in objects), default=0
        )
        if (
            self.force
            or todo
            or not os.path.exists(out)
            or os.path.getmtime(out) < newest_obj
            or _read_text(link_keyf) != link_key
        ):
            os.makedirs(os.path.dirname(out), exist_ok=True)
            print("linking", out, flush=True)
            rc, log = _run_quiet(link_cmd)
            if rc != 0:
                sys.stderr.write(f"$ {shlex.join(link_cmd)}\n{log}")
                raise SystemExit(f"error: linking {SO_NAME} failed")
            if log:
                sys.stdout.write(log)
            _write_text(link_keyf, link_key)
        else:
            print(f"{out} is up to date", flush=True)

    @staticmethod
    def _object_fresh(obj, dep, keyf, key):
        obj, dep = os.path.join(ROOT, obj), os.path.join(ROOT, dep)
        if not (os.path.exists(obj) and os.path.exists(dep)):
            return False
        if _read_text(keyf) != key:
            return False
        t = os.path.getmtime(obj)
        try:
            return all(
                os.path.getmtime(os.path.join(ROOT, d)) <= t for d in _read_deps(dep)
            )
        except OSError:  # a header was deleted or renamed
            return False

    @staticmethod
    def _compile_all(todo, cache_key, jobs):
        def one(item):
            src, obj, keyf, cmd = item
            os.makedirs(os.path.join(ROOT, os.path.dirname(obj)), exist_ok=True)
            try:
                os.remove(os.path.join(ROOT, keyf))  # invalid until this succeeds
            except FileNotFoundError:
                pass
            rc, log = _run_quiet(cmd)
            if rc == 0:
                _write_text(keyf, cache_key(cmd))
            return src, cmd, rc, log

        failed = []
        with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
            futures = [pool.submit(one, item) for item in todo]
            done = 0
            for fut in concurrent.futures.as_completed(futures):
                if fut.cancelled():
                    continue
                src, cmd, rc, log = fut.result()
                done += 1
                status = "ok" if rc == 0 else "FAILED"
                print(f"[{done}/{len(todo)}] {src}: {status}", flush=True)
                if rc != 0:
                    sys.stderr.write(f"$ {shlex.join(cmd)}\n")
                    failed.append(src)
                    for f in futures:  # stop queued work after a failure
                        f.cancel()
                if log:
                    (sys.stderr if rc else sys.stdout).write(log)
                    (sys.stderr if rc else sys.stdout).flush()
        if failed:
            raise SystemExit("error: compiling failed: " + ", ".join(failed))


def _read_text(path):
    try:
        with open(os.path.join(ROOT, path)) as f:
            return f.read()
    except FileNotFoundError:
        return None


def _write_text(path, text):
    path = os.path.join(ROOT, path)
    tmp = f"{path}.tmp{os.getpid()}.{threading.get_ident()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


# models/ (the example models kungfu-strategy builds strategies for) is a
# directory of scripts importing each other by bare name, not a package; an
# installed kungfu_tf carries a copy as kungfu_tf/example_models/.
MODELS_DIR = "models"
INSTALLED_MODELS_DIR = os.path.join("kungfu_tf", "example_models")


class BuildPy(build_py):
    """Generates the proto stubs before the package's modules are collected,
    and copies models/*.py into the built package."""

    def run(self):
        generate_protos()
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install reads models/ from the source tree
        target = os.path.join(self.build_lib, INSTALLED_MODELS_DIR)
        self.mkpath(target)
        for src in _rel(os.path.join(MODELS_DIR, "*.py")):
            self.copy_file(os.path.join(ROOT, src), os.path.join(target, os.path.basename(src)))


class Sdist(sdist):
    """Ships proto/ and headers; leaves out generated stubs (rebuilt from proto/)."""

    def make_release_tree(self, base_dir, files):
        generated = re.compile(r"_pb2(_grpc)?\.pyi?$")
        files = [f for f in files if not generated.search(f)]
        extra = _rel(
            "proto/*.proto", "ops/*/*.h", "models/*.py", "requirements.txt", "constraints.txt", "pyproject.toml"
        )
        super().make_release_tree(base_dir, sorted(set(files) | set(extra)))


setup(
    name="kungfu_tf",
    version="0.1.0",
    description="Adaptive distributed training for TensorFlow",
    python_requires=">=3.11",
    packages=find_namespace_packages(
        include=["kungfu_tf", "kungfu_tf.*"], exclude=["*.__pycache__"]
    ),
    ext_modules=[Extension(EXT_NAME, sources=cc_sources(), depends=cc_headers())],
    install_requires=[
        "tensorflow-cpu==2.21.0",
        "numpy",
        # The AutoStrategy ranker (kungfu_tf/strategy/auto/ranker.py): the version CI tests, as in constraints.txt.
        "scikit-learn==1.9.1",
        runtime_requirement("grpcio"),
        runtime_requirement("protobuf"),
    ],
    # `pip install kungfu_tf[ray]`: `kungfu-run --ray ADDRESS` (Ray Core
    # only; the version CI tests, see constraints.txt).
    extras_require={"ray": [RAY_REQUIREMENT]},
    entry_points={
        "console_scripts": [
            "kungfu-run = kungfu_tf.run.launch.launcher:main",
            "kungfu-strategy = kungfu_tf.strategy.cli:main",
        ]
    },
    cmdclass={"build_ext": BuildExt, "build_py": BuildPy, "sdist": Sdist},
    zip_safe=False,
)
