"""Commands and renderers: monitor async ..., osdata tables, the JSON graph document."""
