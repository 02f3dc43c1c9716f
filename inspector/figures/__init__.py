"""Plotly figure builders, one module per view: data in, go.Figure out."""
