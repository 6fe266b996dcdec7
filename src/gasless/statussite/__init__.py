"""The status site: a separate deployment serving the API's published feed files and a human page."""
