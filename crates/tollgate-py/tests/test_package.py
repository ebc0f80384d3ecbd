"""The installed package itself: one abi3 wheel for CPython 3.11+ (SPEC
PY-1), typed, documented, with the gateway's error codes (PY-6)."""

from __future__ import annotations

import ast
import importlib.metadata
import inspect
import pathlib
import sys

import tollgate
import tollgate._tollgate as native
import tollgate.testing

REPO = pathlib.Path(__file__).resolve().parents[3]


def test_installed_as_one_abi3_wheel_for_cpython_311_and_newer() -> None:
    """PY-1: `import tollgate` loads the installed distribution (not the
    source tree), whose wheel is one abi3 wheel for CPython 3.11+ built by
    maturin, its extension module the abi3 build of the Rust crate."""
    dist = importlib.metadata.distribution("tollgate")
    assert dist.version == tollgate.__version__
    assert dist.metadata["Requires-Python"] == ">=3.11"
    installed = pathlib.Path(dist.locate_file("tollgate")).resolve()
    assert pathlib.Path(tollgate.__file__).resolve().parent == installed
    wheel = dist.read_text("WHEEL") or ""
    assert "Generator: maturin" in wheel
    tags = [line.split(":", 1)[1].strip() for line in wheel.splitlines() if line.startswith("Tag:")]
    assert tags and all(t.startswith("cp311-abi3-") for t in tags), tags
    assert pathlib.Path(native.__file__).name.split(".")[1] in ("abi3", "pyd"), native.__file__
    assert sys.version_info >= (3, 11)


def test_package_holds_no_engine_logic() -> None:
    """PY-1: the Python modules are wrappers (errors, the httpx glue, the
    simulator's handle); the limiter, the lease, supervised calls and the
    transport's core are the Rust extension's classes."""
    for cls in (tollgate.Limiter, tollgate.Lease, tollgate.SupervisedStream, native.TransportCore):
        assert cls.__module__ == "tollgate._tollgate", (cls, cls.__module__)
        for name in dir(cls):
            if not name.startswith("__"):
                assert not inspect.isfunction(getattr(cls, name)), f"{cls.__name__}.{name} is Python code"


def stub_names(path: pathlib.Path) -> dict[str, set[str]]:
    """The classes of a .pyi stub and the names each declares."""
    tree = ast.parse(path.read_text())
    out: dict[str, set[str]] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            out[node.name] = {
                n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            }
    return out


def test_typed_and_documented() -> None:
    """PY-6: `py.typed` and the extension's `.pyi` stub ship with the
    package; the stub declares every public method of the extension's
    public classes; every public name has a docstring."""
    root = pathlib.Path(tollgate.__file__).parent
    assert (root / "py.typed").is_file()
    stubs = stub_names(root / "_tollgate.pyi")
    for cls in (tollgate.Limiter, tollgate.Lease, tollgate.SupervisedStream):
        public = {n for n in dir(cls) if not n.startswith("_")}
        missing = public - stubs[cls.__name__]
        assert not missing, f"{cls.__name__}: not in the stub: {missing}"
        for name in public:
            assert inspect.getdoc(getattr(cls, name)), f"{cls.__name__}.{name} has no docstring"
    for name in tollgate.__all__:
        if name != "__version__":
            assert inspect.getdoc(getattr(tollgate, name)), f"tollgate.{name} has no docstring"
    assert inspect.getdoc(tollgate.testing.simulator)


def test_exceptions_carry_the_gateways_codes() -> None:
    """PY-6: an exception for a situation the gateway also answers carries
    the gateway's `error.code` for it (crates/tollgate-gateway/src/error.rs);
    the others carry the engine's name, and every one is a TollgateError."""
    gateway = (REPO / "crates/tollgate-gateway/src/error.rs").read_text()
    shared = {
        tollgate.AdmissionRejected: "admission_rejected",
        tollgate.EstimateExceedsLimit: "estimate_exceeds_limit",
        tollgate.QuotaStoreUnavailable: "quota_store_unavailable",
        tollgate.Closed: "shutting_down",
        tollgate.DeadlineExceeded: "deadline_exceeded",
        tollgate.CircuitOpen: "circuit_open",
        tollgate.UpstreamError: "upstream_error",
    }
    for cls, code in shared.items():
        assert cls.code == code
        assert f'"{code}"' in gateway or f"`{code}`" in gateway, code
    own = {
        tollgate.ConfigError: "invalid_config",
        tollgate.UnknownScope: "unknown_scope",
        tollgate.TokenEstimateRequired: "token_estimate_required",
        tollgate.AlreadySettled: "already_settled",
        tollgate.ProviderError: "provider_error",
    }
    for cls, code in own.items():
        assert cls.code == code
    for name in tollgate.__all__:
        obj = getattr(tollgate, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, tollgate.TollgateError)
            assert obj in shared or obj in own or obj in (tollgate.TollgateError, tollgate.AdmissionError)


def test_imports_without_httpx() -> None:
    """PY-1: `import tollgate` needs nothing but the package (the limiter
    works without httpx); the SDK transports, which need httpx or httpx2,
    say so when used without them."""
    import subprocess

    code = (
        "import sys\n"
        "sys.modules['httpx'] = None\n"
        "sys.modules['httpx2'] = None\n"
        "import tollgate\n"
        "tollgate.Limiter(scopes={'s': {'rpm': 1}})\n"
        "try:\n"
        "    tollgate.Transport\n"
        "except ImportError as e:\n"
        "    print('needs httpx:', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert "needs httpx: tollgate's transports need httpx2 or httpx" in out.stdout, out.stdout
