"""The protocol-neutral middle: what any API asks of the model, and what comes back.

An API module (app.api) parses its wire request into a :class:`~app.core.input.ChatInput` or
:class:`~app.core.input.TextInput`; :mod:`app.core.plan` turns that into an engine request and a
reply spec; :class:`~app.core.service.Service` runs it and returns a typed event stream per
choice (:mod:`app.core.events`), or the fold of those events for a non-streamed answer. Nothing
here knows an API's field names, wire format or error shape.
"""
