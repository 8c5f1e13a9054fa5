"""asyncrsp: the application (session core, trio shell, analysis, engine)."""
