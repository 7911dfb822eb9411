"""``flint chat``: a terminal chat over ``flint.LLM``.

config.py (options, settings, data dir) · session.py (conversation, prompts, JSON) ·
think.py (reasoning/answer split) · render.py (streaming output) · stats.py (status line,
/stats) · commands.py (slash commands) · input.py (prompt_toolkit) · startup.py (loading,
plan line) · app.py (the loop).
"""
