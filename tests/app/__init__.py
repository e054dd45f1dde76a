"""The app in process over the fake engine (Flask's test client), and the process itself (gunicorn, crash guard, worker) with a fake engine."""
