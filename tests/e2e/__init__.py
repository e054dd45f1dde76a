"""End to end: a real gunicorn server with the real model on a loopback port, real clients."""
