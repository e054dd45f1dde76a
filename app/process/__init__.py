"""The process: the command line, gunicorn and its worker, the crash guard."""
