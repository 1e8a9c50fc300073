"""TLS as deployed: a private CA, client certificates, and the checks a user can relax.

A real redis-server listens with `--tls-port`, on certificates that the tests make with openssl:
a private CA, a server certificate for 127.0.0.1/localhost signed by it, a client certificate,
a second CA that signed nothing the server presents, and a server certificate for another host.
The settings come as `rediss://...?ssl_...` URL options and from a redis-py client.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import ssl
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import redis
import redis.asyncio
import redis.sentinel
import redmutex
from _cli_run import run_cli
from _scale_servers import SentinelGroup, wait_for
from redmutex._server import FREE_PORT, RedisServer

pytestmark = pytest.mark.skipif(
    shutil.which("openssl") is None, reason="openssl is not installed (make deps installs it)"
)


@dataclass(frozen=True)
class Pki:
    ca: Path
    other_ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    # The client certificate and its key in one file (redis-py's certfile without keyfile).
    client_combined: Path
    elsewhere_cert: Path
    elsewhere_key: Path


def _openssl(*args: str | Path) -> None:
    subprocess.run(
        ["openssl", *map(str, args)], check=True, capture_output=True, text=True, timeout=60
    )


def _ca(directory: Path, name: str) -> tuple[Path, Path]:
    cert, key = directory / f"{name}.pem", directory / f"{name}.key"
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", key, "-out", cert, "-days", "2", "-subj", f"/CN=redmutex test {name}",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
    )  # fmt: skip
    return cert, key


def _leaf(directory: Path, name: str, ca: tuple[Path, Path], extensions: str) -> tuple[Path, Path]:
    cert, key, csr = (directory / f"{name}.{ext}" for ext in ("pem", "key", "csr"))
    ext = directory / f"{name}.ext"
    ext.write_text(f"basicConstraints=CA:FALSE\n{extensions}\n")
    _openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", key, "-out", csr, "-subj", f"/CN={name}",
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", csr, "-CA", ca[0], "-CAkey", ca[1], "-CAcreateserial",
        "-out", cert, "-days", "2", "-extfile", ext,
    )  # fmt: skip
    return cert, key


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    d = tmp_path_factory.mktemp("pki")
    ca = _ca(d, "ca")
    other_ca = _ca(d, "other-ca")
    server = _leaf(
        d,
        "server",
        ca,
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth",
    )
    client = _leaf(d, "client", ca, "extendedKeyUsage=clientAuth")
    elsewhere = _leaf(
        d, "elsewhere", ca, "subjectAltName=DNS:elsewhere.invalid\nextendedKeyUsage=serverAuth"
    )
    combined = d / "client-combined.pem"
    combined.write_text(client[0].read_text() + client[1].read_text())
    return Pki(
        ca=ca[0],
        other_ca=other_ca[0],
        server_cert=server[0],
        server_key=server[1],
        client_cert=client[0],
        client_key=client[1],
        client_combined=combined,
        elsewhere_cert=elsewhere[0],
        elsewhere_key=elsewhere[1],
    )


@dataclass(frozen=True)
class TlsServer:
    server: RedisServer
    tls_port: int

    def url(self, **options: str | Path) -> str:
        query = "&".join(f"{k}={quote(str(v), safe='/')}" for k, v in options.items())
        return f"rediss://127.0.0.1:{self.tls_port}/0" + (f"?{query}" if query else "")


@pytest.fixture(scope="module")
def tls_servers(pki: Pki) -> Iterator[Callable[..., TlsServer]]:
    """tls_servers(auth_clients=..., cert=..., key=...): a redis-server with a TLS port (and a
    plain one, which only the start-up check uses); started once per set of arguments."""
    started: dict[tuple[str, Path, Path], TlsServer] = {}

    def _get(
        auth_clients: str = "no", cert: Path | None = None, key: Path | None = None
    ) -> TlsServer:
        cert, key = cert or pki.server_cert, key or pki.server_key
        found = started.get((auth_clients, cert, key))
        if found is not None:
            return found
        server = RedisServer(
            extra_args=[
                # Chosen afresh with the main port at each attempt to start (a port chosen
                # before the start may be taken by another test's server meanwhile).
                "--tls-port", FREE_PORT,
                "--tls-cert-file", str(cert),
                "--tls-key-file", str(key),
                "--tls-ca-cert-file", str(pki.ca),
                "--tls-auth-clients", auth_clients,
            ]
        )  # fmt: skip
        try:
            server.start()
        except RuntimeError as exc:
            log = Path(server.dir, "redis.log")
            text = log.read_text(errors="replace") if log.exists() else ""
            if "TLS" in text and ("not supported" in text or "Bad directive" in text):
                pytest.skip(f"this redis-server was built without TLS: {text[-300:]}")
            raise RuntimeError(f"{exc}; log: {text[-1000:]}") from exc
        started[(auth_clients, cert, key)] = TlsServer(server, server.extra_ports[0])
        return started[(auth_clients, cert, key)]

    yield _get
    for tls in started.values():
        tls.server.stop()
        shutil.rmtree(tls.server.dir, ignore_errors=True)


def use(client: Any, name: str = "tls") -> None:
    """Takes and releases a lock over TLS (two round trips at least)."""
    with redmutex.Lock(client, name, ttl=5, timeout=5) as lock:
        assert lock.fence is not None and lock.fence >= 1


def refused(client: Any) -> redmutex.ConnectionError:
    with pytest.raises(redmutex.ConnectionError) as caught:
        use(client)
    return caught.value


def fast(url: str) -> redmutex.Client:
    return redmutex.Client(url, connect_timeout=3, command_timeout=3)


# -- URL options -----------------------------------------------------------------------------


def test_private_ca_from_url(tls_servers: Callable[..., TlsServer], pki: Pki) -> None:
    tls = tls_servers()
    use(fast(tls.url(ssl_ca_certs=pki.ca)))
    # The web roots alone do not know the private CA: refused, naming the endpoint and why.
    err = refused(fast(tls.url()))
    assert f"127.0.0.1:{tls.tls_port}" in str(err), err
    assert "certificate" in str(err).lower(), err


def test_wrong_ca_is_refused_naming_the_endpoint(
    tls_servers: Callable[..., TlsServer], pki: Pki
) -> None:
    tls = tls_servers()
    err = refused(fast(tls.url(ssl_ca_certs=pki.other_ca)))
    text = str(err)
    assert f"127.0.0.1:{tls.tls_port}" in text, text
    assert "UnknownIssuer" in text or "unknown issuer" in text.lower(), text


def test_required_client_certificate(tls_servers: Callable[..., TlsServer], pki: Pki) -> None:
    tls = tls_servers(auth_clients="yes")
    use(
        fast(tls.url(ssl_ca_certs=pki.ca, ssl_certfile=pki.client_cert, ssl_keyfile=pki.client_key))
    )
    # Certificate and key in one file, as Python's ssl accepts it.
    use(fast(tls.url(ssl_ca_certs=pki.ca, ssl_certfile=pki.client_combined)))
    # Without one, the server drops the connection: a ConnectionError naming the endpoint.
    err = refused(fast(tls.url(ssl_ca_certs=pki.ca)))
    assert f"127.0.0.1:{tls.tls_port}" in str(err), err


def test_cert_reqs_none_skips_every_check(tls_servers: Callable[..., TlsServer], pki: Pki) -> None:
    tls = tls_servers()
    # No CA given and the web roots do not know ours: only "no verification" connects.
    use(fast(tls.url(ssl_cert_reqs="none")))
    use(fast(tls.url(ssl_ca_certs=pki.other_ca, ssl_cert_reqs="none")))
    use(fast(tls.url(ssl_ca_certs=pki.ca, ssl_cert_reqs="required")))
    use(fast(tls.url(ssl_ca_certs=pki.ca, ssl_cert_reqs="optional")))


def test_check_hostname_false_still_checks_the_ca(
    tls_servers: Callable[..., TlsServer], pki: Pki
) -> None:
    tls = tls_servers(cert=pki.elsewhere_cert, key=pki.elsewhere_key)
    err = refused(fast(tls.url(ssl_ca_certs=pki.ca)))
    assert f"127.0.0.1:{tls.tls_port}" in str(err), err
    use(fast(tls.url(ssl_ca_certs=pki.ca, ssl_check_hostname="false")))
    # The chain is still checked.
    refused(fast(tls.url(ssl_ca_certs=pki.other_ca, ssl_check_hostname="false")))


@pytest.mark.parametrize(
    ("query", "words"),
    [
        ("ssl_cert_reqs=maybe", "ssl_cert_reqs must be required, optional or none"),
        ("ssl_check_hostname=perhaps", "ssl_check_hostname must be true or false"),
        ("ssl_ca_certs=", "ssl_ca_certs needs a file path"),
        ("ssl_keyfile=/k.pem", "ssl_keyfile needs ssl_certfile"),
        ("ssl_ciphers=ALL", "unknown TLS option 'ssl_ciphers'"),
        ("ssl_cert_reqs=none&ssl_cert_reqs=none", "ssl_cert_reqs is given twice"),
        ("ssl_ca_certs=/nonexistent/ca.pem", "ssl_ca_certs: cannot read '/nonexistent/ca.pem'"),
    ],
)
def test_bad_options_are_value_errors(query: str, words: str) -> None:
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        redmutex.Client(f"rediss://127.0.0.1:1/0?{query}")


def test_options_need_a_tls_url(tmp_path: Path) -> None:
    for url in (
        "redis://127.0.0.1:1/0?ssl_cert_reqs=none",
        "unix:///tmp/r.sock?ssl_cert_reqs=none",
        "redis+sentinel://127.0.0.1:1/svc?ssl_cert_reqs=none",
    ):
        with pytest.raises(ValueError, match="ssl_"):
            redmutex.Client(url)
    with pytest.raises(ValueError, match="ssl_"):
        redmutex.Client(cluster=["redis://127.0.0.1:1?ssl_cert_reqs=none"])
    not_pem = tmp_path / "ca.pem"
    not_pem.write_text("hello")
    for url in ("rediss://127.0.0.1:1/0", "rediss+sentinel://127.0.0.1:1/svc"):
        with pytest.raises(ValueError, match="holds no PEM block"):
            redmutex.Client(f"{url}?ssl_ca_certs={not_pem}")
    with pytest.raises(ValueError, match="holds no PEM block"):
        redmutex.Client(cluster=[f"rediss://127.0.0.1:1?ssl_ca_certs={not_pem}"])


def test_redlock_masters_take_options(tls_servers: Callable[..., TlsServer], pki: Pki) -> None:
    tls = tls_servers()
    client = redmutex.Client([tls.url(ssl_ca_certs=pki.ca)], connect_timeout=3, command_timeout=3)
    use(client)


def test_sentinel_url_takes_options(pki: Pki) -> None:
    """The CA (and the other settings) of a rediss+sentinel:// URL serve the sentinels' and the
    master's connections alike."""
    with SentinelGroup(tls=(str(pki.server_cert), str(pki.server_key)), tls_ca=str(pki.ca)) as g:
        hosts = ",".join(f"127.0.0.1:{g.link_port(s)}" for s in g.sentinels)
        url = f"rediss+sentinel://{hosts}/{g.name}"
        use(fast(f"{url}?ssl_ca_certs={quote(str(pki.ca), safe='/')}"))
        # The sentinels' certificates are checked too: another CA's is refused at the first.
        err = refused(fast(f"{url}?ssl_ca_certs={quote(str(pki.other_ca), safe='/')}"))
        assert "Sentinel" in str(err) and "UnknownIssuer" in str(err), err
        # A master that names a host its certificate does not: refused, unless told to accept.
        # (Here every certificate names 127.0.0.1, so the hostname check passes as it is.)
        use(fast(f"{url}?ssl_ca_certs={quote(str(pki.ca), safe='/')}&ssl_check_hostname=false"))
        # The command line reads the same URL (its redis-py clients take the same settings).
        with_ca = f"{url}?ssl_ca_certs={quote(str(pki.ca), safe='/')}"
        with redmutex.Lock(fast(with_ca), "shown", ttl=10) as lock:
            done = run_cli("status", "shown", "--redis", with_ca, "--json")
            assert done.returncode == 0, done.stderr
            assert json.loads(done.stdout)["fence"] == lock.fence
        # Redis's own client over the same settings, as from_redis carries them.
        tls = {"ssl": True, "ssl_ca_certs": str(pki.ca), "socket_timeout": 5}
        sentinels = redis.sentinel.Sentinel(
            [("127.0.0.1", g.link_port(g.sentinel))], sentinel_kwargs=tls
        )
        master = sentinels.master_for(g.name, **tls)
        assert master.ping()
        use(master)


# -- from a redis-py client ------------------------------------------------------------------


def test_redis_py_client_settings_are_carried_over(
    tls_servers: Callable[..., TlsServer], pki: Pki
) -> None:
    tls = tls_servers(auth_clients="yes")
    kwargs: dict[str, Any] = {
        "host": "127.0.0.1",
        "port": tls.tls_port,
        "ssl": True,
        "ssl_ca_certs": str(pki.ca),
        "ssl_certfile": str(pki.client_cert),
        "ssl_keyfile": str(pki.client_key),
        "socket_connect_timeout": 3,
        "socket_timeout": 3,
    }
    r = redis.Redis(**kwargs)
    try:
        assert r.ping()  # redis-py itself connects with these settings
        use(r)
        use(redis.Redis.from_url(tls.url(ssl_ca_certs=pki.ca, ssl_certfile=pki.client_combined)))
        # redis-py without the client certificate: refused by the server, naming the endpoint.
        no_cert = redis.Redis(**{**kwargs, "ssl_certfile": None, "ssl_keyfile": None})
        err = refused(no_cert)
        assert f"127.0.0.1:{tls.tls_port}" in str(err), err
        wrong_ca = redis.Redis(**{**kwargs, "ssl_ca_certs": str(pki.other_ca)})
        err = refused(wrong_ca)
        assert f"127.0.0.1:{tls.tls_port}" in str(err), err
    finally:
        r.close()


def test_redis_py_cert_reqs_and_hostname(tls_servers: Callable[..., TlsServer], pki: Pki) -> None:
    tls = tls_servers(cert=pki.elsewhere_cert, key=pki.elsewhere_key)
    base: dict[str, Any] = {
        "host": "127.0.0.1",
        "port": tls.tls_port,
        "ssl": True,
        "socket_timeout": 3,
    }
    # The certificate names another host: refused unless the check is off, as in redis-py.
    refused(redis.Redis(**base, ssl_ca_certs=str(pki.ca)))
    use(redis.Redis(**base, ssl_ca_certs=str(pki.ca), ssl_check_hostname=False))
    use(redis.Redis(**base, ssl_cert_reqs="none"))
    use(redis.Redis(**base, ssl_cert_reqs=ssl.CERT_NONE))


def test_redis_py_settings_without_counterpart_are_refused(pki: Pki) -> None:
    r = redis.Redis(host="127.0.0.1", port=1, ssl=True, ssl_ca_path=str(pki.ca.parent))
    with pytest.raises(ValueError, match="ssl_ca_path is not supported"):
        use(r)


@pytest.mark.parametrize(
    "setting",
    [
        {"ssl_min_version": ssl.TLSVersion.TLSv1_3},
        {"ssl_ciphers": "ECDHE-ECDSA-AES256-GCM-SHA384"},
        {"ssl_include_verify_flags": [ssl.VerifyFlags.VERIFY_X509_STRICT]},
        {"ssl_exclude_verify_flags": [ssl.VerifyFlags.VERIFY_X509_PARTIAL_CHAIN]},
        {"ssl_validate_ocsp": True},
        {"ssl_validate_ocsp_stapled": True},
        {"ssl_ocsp_expected_cert": "-----BEGIN CERTIFICATE-----"},
    ],
)
def test_redis_py_checks_redmutex_cannot_make_are_refused(setting: dict[str, Any]) -> None:
    # Dropped, redmutex would connect where redis-py refuses: a ValueError naming it instead.
    r = redis.Redis(host="127.0.0.1", port=1, ssl=True, **setting)
    with pytest.raises(ValueError, match=f"{next(iter(setting))} is not supported"):
        redmutex.Client.from_redis(r)


def test_redis_py_tls_defaults_are_accepted(
    tls_servers: Callable[..., TlsServer], pki: Pki
) -> None:
    defaults: dict[str, Any] = {
        "ssl_min_version": None,
        "ssl_ciphers": None,
        "ssl_include_verify_flags": None,
        "ssl_exclude_verify_flags": None,
        "ssl_validate_ocsp": False,
        "ssl_validate_ocsp_stapled": False,
        "ssl_ocsp_context": None,
        "ssl_ocsp_expected_cert": None,
    }
    tls = tls_servers()
    use(redis.Redis(port=tls.tls_port, ssl=True, ssl_ca_certs=str(pki.ca), **defaults))


@pytest.fixture(scope="module")
def tls_cluster(pki: Pki) -> Iterator[int]:
    """A one-node Redis Cluster that talks TLS (clients and bus); yields its TLS port."""
    server = RedisServer(
        extra_args=[
            "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
            "--cluster-port", FREE_PORT, "--tls-port", FREE_PORT,
            "--tls-cert-file", str(pki.server_cert), "--tls-key-file", str(pki.server_key),
            "--tls-ca-cert-file", str(pki.ca), "--tls-auth-clients", "no",
            "--tls-cluster", "yes",
        ]
    )  # fmt: skip
    server.start()
    try:
        with redis.Redis(port=server.port, socket_timeout=5) as admin:
            admin.execute_command("CLUSTER", "ADDSLOTSRANGE", "0", "16383")
            wait_for(
                "the cluster to be ok",
                lambda: b"cluster_state:ok" in admin.execute_command("CLUSTER", "INFO"),
            )
        yield server.extra_ports[1]
    finally:
        server.stop()
        shutil.rmtree(server.dir, ignore_errors=True)


def test_redis_py_cluster_over_tls(tls_cluster: int, pki: Pki) -> None:
    # ssl_cert_reqs="none" is carried over (as #insecure), as for one server.
    rc = redis.RedisCluster(
        host="127.0.0.1", port=tls_cluster, ssl=True, ssl_cert_reqs="none", socket_timeout=3
    )
    try:
        assert rc.ping()
        use(rc)
    finally:
        rc.close()
    # An asyncio RedisCluster before its first command: its seeds.
    use(
        redis.asyncio.RedisCluster(
            host="127.0.0.1", port=tls_cluster, ssl=True, ssl_cert_reqs="none"
        ),
        "tls-aio",
    )
    # A CA file is carried over to the seeds' URLs (and the nodes learned from them).
    rc = redis.RedisCluster(
        host="127.0.0.1", port=tls_cluster, ssl=True, ssl_ca_certs=str(pki.ca), socket_timeout=3
    )
    try:
        use(rc, "tls-ca")
    finally:
        rc.close()


def test_cluster_seeds_take_options(tls_cluster: int, pki: Pki) -> None:
    seed = f"rediss://127.0.0.1:{tls_cluster}"
    use(redmutex.Client(cluster=[f"{seed}?ssl_ca_certs={pki.ca}"], connect_timeout=3))
    err = refused(redmutex.Client(cluster=[f"{seed}?ssl_ca_certs={pki.other_ca}"]))
    assert "UnknownIssuer" in str(err), err
    # One set of options serves every node the cluster client learns of: seeds must agree.
    with pytest.raises(ValueError, match="same ssl_"):
        redmutex.Client(cluster=[f"{seed}?ssl_ca_certs={pki.ca}", seed])


@pytest.mark.parametrize(
    "options",
    [
        "?ssl_cert_reqs=none",
        "?ssl_ca_certs={other}&ssl_cert_reqs=none",
        "?ssl_ca_certs={other}#insecure",
    ],
)
def test_cluster_seeds_without_certificate_checks(tls_cluster: int, pki: Pki, options: str) -> None:
    """ssl_cert_reqs=none (or #insecure) beside other ssl_* options checks no certificate, on
    a cluster as on one server: the cluster client's own connections to the nodes included
    (with a CA or any option given, it checked every certificate: UnknownIssuer)."""
    url = f"rediss://127.0.0.1:{tls_cluster}" + options.format(other=pki.other_ca)
    client = redmutex.Client(cluster=[url], connect_timeout=3, command_timeout=3)
    use(client, "insecure-seed")

    async def aio_use() -> None:
        async with redmutex.aio.Lock(client, "insecure-seed-aio", ttl=5, timeout=5) as lock:
            assert lock.fence is not None

    asyncio.run(aio_use())
    # Seeds that check certificates differently cannot share the one setting of every node.
    checked = f"rediss://127.0.0.1:{tls_cluster}?ssl_ca_certs={pki.other_ca}"
    if "#insecure" in options:
        with pytest.raises(ValueError, match="check certificates alike"):
            redmutex.Client(cluster=[url, checked])


def test_redis_py_cluster_without_certificate_checks(tls_cluster: int, pki: Pki) -> None:
    rc = redis.RedisCluster(
        host="127.0.0.1",
        port=tls_cluster,
        ssl=True,
        ssl_cert_reqs="none",
        ssl_ca_certs=str(pki.other_ca),
        socket_timeout=3,
    )
    try:
        assert rc.ping()
        use(rc, "insecure-redis-py")
    finally:
        rc.close()


def test_a_ca_file_in_a_folder_with_a_space(
    tls_servers: Callable[..., TlsServer], pki: Pki, tmp_path: Path
) -> None:
    ca = tmp_path / "ca dir+x" / "ca file.pem"
    ca.parent.mkdir()
    shutil.copy(pki.ca, ca)
    tls = tls_servers()
    use(redis.Redis(host="127.0.0.1", port=tls.tls_port, ssl=True, ssl_ca_certs=str(ca)))
    # In a URL's query, as redis-py reads it: '+' is a space, %2B a '+'.
    plus = str(ca).replace(" ", "+").replace("+x", "%2Bx")
    use(fast(f"rediss://127.0.0.1:{tls.tls_port}/0?ssl_ca_certs={plus}"))
