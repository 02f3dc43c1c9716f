"""Streamlit helpers shared by app.py and the pages: model picker, caching, errors."""
