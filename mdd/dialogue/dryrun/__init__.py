"""The scripted dry-run writer: an offline engine that needs no model (``engine.name: scripted``).

``engine.py`` writes the doctor's questions, the tool agent's verdicts and the case writer's records;
``speech.py`` the patient's and the companion's answers, shaped by the speech styles. It lives with
the dialogue because it writes the dialogue's text from what the loop knows; the engines in
``mdd/engines/`` know nothing of the domain.
"""
