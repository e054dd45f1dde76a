"""WSGI entry for running under a gunicorn of your own: ``gunicorn -c python:app.gunicorn_conf
app.wsgi:app``. Settings come from the environment."""

from app import create_app
from app.gunicorn_conf import exit_worker_on_load_failure
from app.settings import Settings

app = create_app(Settings(), on_fatal=exit_worker_on_load_failure)
