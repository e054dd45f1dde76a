"""The HTTP edge outside any API: health and model routes, API keys, log lines."""
