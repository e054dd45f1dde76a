"""WSGI entry for running under a gunicorn of your own: ``gunicorn -c python:app.process.gunicorn_conf
app.process.wsgi:app``. Settings come from the environment."""

from app import create_app
from app.process.crash_guard import apply_safe_mode, apply_safe_mode_to_models
from app.process.gunicorn_conf import exit_worker_on_load_failure, shared_guard
from app.settings import Settings
from app.settings.models import catalog_settings_set, not_served_yet

_settings = Settings()
if not_served_yet(_settings):  # what of several models is not built yet: stop, not ignore it
    raise SystemExit(f"vertex-gguf: {not_served_yet(_settings)}")
_boot = shared_guard(_settings).start_worker()
if catalog_settings_set(_settings):  # several models (docs/models.md)
    from app.model.catalog import CatalogError, build

    try:
        _catalog = build(_settings)
    except CatalogError as exc:
        raise SystemExit(f"vertex-gguf: {exc}") from None
    app = create_app(apply_safe_mode(_settings, _boot), on_fatal=exit_worker_on_load_failure,
                     boot=_boot, catalog=apply_safe_mode_to_models(_catalog, _boot))
else:
    app = create_app(apply_safe_mode(_settings, _boot), on_fatal=exit_worker_on_load_failure,
                     boot=_boot)
