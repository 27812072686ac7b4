"""Settings in one place (pydantic-settings).

Each service subclasses ``ServiceSettings`` with its own env prefix (``TAO_PLANNER_``,
``TAO_ROUTER_``, ...). Precedence, highest first: explicit overrides (CLI flags), environment
variables, the optional config file (YAML or JSON, ``--config`` or ``TAO_<SVC>_CONFIG_FILE``),
defaults. Nothing else in the code reads ``os.environ``.
"""

from __future__ import annotations

import json
from contextvars import ContextVar
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar

import yaml
from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict
from pydantic_settings.exceptions import SettingsError

from services.common.errors import StartupError
from services.common.redis_client import parse_redis_url

_file_values: ContextVar[dict[str, Any] | None] = ContextVar("tao_settings_file", default=None)


class _FileSource(PydanticBaseSettingsSource):
    """Values from the config file given to ``load_settings``."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        values = _file_values.get() or {}
        return values.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        values = _file_values.get() or {}
        return {k: v for k, v in values.items() if k in self.settings_cls.model_fields}


class ServiceSettings(BaseSettings):
    """Settings every TAO service has."""

    model_config = SettingsConfigDict(extra="forbid", validate_default=True, env_nested_delimiter="__")

    service_name: ClassVar[str] = "service"

    host: str = Field(default="127.0.0.1", description="gRPC bind address")
    port: int = Field(default=0, ge=0, le=65535, description="gRPC port (0 picks a free one)")
    metrics_port: int | None = Field(
        default=None, ge=0, le=65535, description="Prometheus /metrics port; unset disables, 0 picks one"
    )
    redis_url: str = Field(
        default="redis://127.0.0.1:6379/0",
        description="redis:// or rediss:// (one server), redis+sentinel://host:port,host:port/service_name[/db] "
        "(the master Sentinel names), redis+cluster://host:port,host:port (a Redis Cluster); rediss+ for TLS")
    redis_username: str | None = Field(default=None, description="Redis ACL user")
    redis_password: SecretStr | None = Field(default=None, description="Redis password")
    redis_ca_file: Path | None = Field(default=None, description="CA bundle for rediss://")
    redis_sentinel_password: SecretStr | None = Field(
        default=None, description="password of the Sentinel processes themselves (redis+sentinel://), if they have one")
    redis_timeout_s: float = Field(default=2.0, gt=0, le=60)
    redis_startup_timeout_s: float = Field(default=10.0, ge=0, le=600, description="how long start-up waits for Redis")
    auth_token: SecretStr | None = Field(default=None, description="bearer token required on every RPC but health")
    admin_token: SecretStr | None = Field(
        default=None, description="bearer token the admin RPCs need (interceptors.ADMIN_METHODS: RouterAdminService, "
        "BudgetService.ConfigureTenants/SetPolicy); it is accepted on every other RPC too. Unset: auth_token")
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    tls_client_ca_file: Path | None = Field(default=None, description="require client certs signed by this CA (mTLS)")
    grace_s: float = Field(default=5.0, ge=0, le=300, description="graceful-shutdown grace for in-flight RPCs")
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_format: Literal["json", "console"] = "json"
    #: uvloop (libuv's loop) by default: 3–9 % less router CPU per streamed token than asyncio's
    #: (docs/benchmarks.md#router). redis-py sees the same errors on both since its connections
    #: translate uvloop's closed-transport RuntimeError (services.common.redis_client).
    event_loop: Literal["asyncio", "uvloop"] = Field(
        default="uvloop", description="uvloop's event loop (asyncio's where uvloop is not installed), or asyncio's")
    config_file: Path | None = None
    time_scale: float = Field(
        default=1.0, gt=0, le=1000,
        description="emulation only: model seconds per wall second (replicas run this much faster); "
        "all shared timestamps and time constants are in model time (ScaledClock)",
    )

    def admin_secret(self) -> str | None:
        """The admin token in force: ``admin_token``, else ``auth_token`` (backward compatible)."""
        token = self.admin_token or self.auth_token
        return token.get_secret_value() if token else None

    @field_validator("redis_url")
    @classmethod
    def _check_redis_url(cls, value: str) -> str:
        parse_redis_url(value)  # ValueError says what is wrong
        return value

    @model_validator(mode="after")
    def _check_tls(self) -> ServiceSettings:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("tls_cert_file and tls_key_file must be given together")
        if self.tls_client_ca_file is not None and self.tls_cert_file is None:
            raise ValueError("tls_client_ca_file (mTLS) needs tls_cert_file and tls_key_file")
        for path in (self.tls_cert_file, self.tls_key_file, self.tls_client_ca_file, self.redis_ca_file):
            if path is not None and not path.is_file():
                raise ValueError(f"file not found: {path}")
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, _FileSource(settings_cls), file_secret_settings)


class LeaderElectionSettings(ServiceSettings):
    """Settings of a service that runs active/standby (planner, budget): one leader at a time,
    elected by a Redis lease (services/common/lease.py, docs/architecture.md#high-availability)."""

    leader_election: bool = Field(
        default=True, description="hold a Redis lease to publish; several instances run active/standby. "
        "Off: this instance always publishes (one instance only)")
    lease_ttl_s: float = Field(
        default=5.0, ge=0.3, le=300.0, description="wall seconds: the leader renews every ttl/3; a standby takes "
        "over within about ttl + ttl/3 of the leader's death (at once after a clean shutdown)")


S = TypeVar("S", bound=ServiceSettings)


def _read_config_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise StartupError(f"cannot read config file {path}: {exc.strerror}") from exc
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise StartupError(f"config file {path} is not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise StartupError(f"config file {path} must hold a mapping of settings")
    return {str(k).replace("-", "_"): v for k, v in data.items()}


def load_settings(cls: type[S], config_file: Path | None = None, **overrides: Any) -> S:
    """Build validated settings; raise ``StartupError`` with one clear line when invalid."""
    overrides = {k: v for k, v in overrides.items() if v is not None}
    if config_file is None:
        try:
            probe = cls(**overrides)
            config_file = probe.config_file
        except (ValidationError, SettingsError):
            config_file = None
    values = _read_config_file(config_file) if config_file is not None else None
    token = _file_values.set(values)
    try:
        return cls(**overrides)
    except ValidationError as exc:
        raise StartupError(f"invalid {cls.service_name} settings: {describe_validation_error(exc)}") from exc
    except SettingsError as exc:  # an environment value of a list/mapping setting that is not JSON
        raise StartupError(f"invalid {cls.service_name} settings: {exc}; list and mapping settings "
                           'given in the environment are JSON, e.g. \'["a", "b"]\' or \'{"k": 1}\'') from exc
    finally:
        _file_values.reset(token)


def describe_validation_error(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "settings"
        parts.append(f"{loc}: {err['msg']}")
    return "; ".join(parts)
