"""Grammars: every grammar the engine sees is built and checked here.

Grammars come from four places (a request's ``grammar`` field, ``response_format`` json_object
/ json_schema, tool schemas for required calls, lazy tool grammars). JSON Schemas become GBNF in
:mod:`app.grammar.json_schema`; every grammar, whatever made it, passes the gate in
:mod:`app.grammar.gate` before llama.cpp sees it. Import the module you use: this package
re-exports nothing.
"""
