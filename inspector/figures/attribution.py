"""Figures for attributions: token heatmap, image overlay, conductance bars, completeness line.

NaN scores stay NaN: heatmap cells are left blank and marked "NaN", bars are missing
and labelled, never drawn as zeros.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from ..attribution import Attribution
from ..utils.escaping import escaped_figure, plot_text
from .palette import readable

DIVERGING = "RdBu"
MAX_TOKENS = 512
MAX_TICKS = 20  # token labels on the x axis of a token heatmap; every n-th token beyond that


@escaped_figure
def token_heatmap(result: Attribution, title: str | None = None,
                  decode: Callable[[int], str] | None = None) -> go.Figure:
    """Tokens along x, one row per sample, the summed attribution as colour; values in hover.

    With ``decode`` (token id -> text, from the model's tokenizer) the axis shows the tokens as
    text; without one it shows their ids.

    >>> import torch
    >>> a = torch.tensor([[[0.25, 0.25], [float("nan"), 1.0]]])  # (1 sample, 2 tokens, width 2)
    >>> r = Attribution("layer_ig", "ig", "LayerIntegratedGradients", 3, 1, "wte",
    ...                       (a,), (torch.tensor([[5, 7]]),), token_model=True)
    >>> token_heatmap(r).data[0].text.tolist()
    [['', 'NaN']]
    """
    s = _first_tensor(result.summary)
    s = s[s["index"] >= s["index"].max() - MAX_TOKENS + 1]
    z = s.pivot(index="sample", columns="index", values="score")
    tok = s.pivot(index="sample", columns="index", values="token")
    nans = s.pivot(index="sample", columns="index", values="nans")
    abs_s = s.pivot(index="sample", columns="index", values="abs_score")
    x = [f"{p}" for p in z.columns]
    first = tok.iloc[0].tolist()
    every = max(1, -(-len(x) // MAX_TICKS))  # label every n-th token so labels never overlap
    ticks = [f"{plot_text(p)}<br>{'' if pd.isna(t) else plot_text(_token_text(int(t), decode))}"
             for p, t in zip(z.columns, first, strict=True)]
    text = np.where(z.isna().to_numpy(), "NaN", "")
    custom = np.dstack([tok.to_numpy(dtype=object), abs_s.to_numpy(dtype=object),
                        nans.to_numpy(dtype=object)])
    fig = go.Figure(go.Heatmap(
        z=z.to_numpy(dtype=float), x=x, y=[f"sample {i}" for i in z.index], text=text,
        texttemplate="%{text}", customdata=custom, colorscale=DIVERGING, zmid=0,
        colorbar=dict(title="score"),
        hovertemplate=("position %{x}<br>token %{customdata[0]}<br>score %{z:.4g}"
                       "<br>|score| %{customdata[1]:.4g}<br>NaN values %{customdata[2]}<extra></extra>")))
    where = result.layer or "inputs"
    fig.update_layout(title=title or f"{result.captum_method} on {where}: target {result.target}"
                      + (f" at position {result.position}" if result.position is not None else ""),
                      xaxis=dict(title=f"position / token {'text' if decode else 'id'}"
                                 + (f" (every {every}th labelled)" if every > 1
                                                                  else ""),
                                 tickvals=x[::every], ticktext=ticks[::every], tickangle=0),
                      height=240 + 40 * len(z.index), margin=dict(l=60, r=20, t=50, b=60))
    return fig


def _token_text(token: int, decode: Callable[[int], str] | None, width: int = 10) -> str:
    """A token for an axis label: its text (spaces shown as ␣, cut to ``width``), else its id.

    >>> _token_text(3, lambda t: " the"), _token_text(3, None), _token_text(3, lambda t: "x" * 20)[-1]
    ('␣the', '3', '…')
    """
    if decode is None:
        return str(token)
    try:
        text = decode(token).replace(" ", "␣").replace("\n", "⏎") or str(token)
    except Exception:  # noqa: BLE001 - a tokenizer that cannot decode an id: show the id
        return str(token)
    return text if len(text) <= width else text[:width - 1] + "…"


@escaped_figure
def image_overlay(result: Attribution, sample: int = 0, opacity: float = 0.6) -> go.Figure:
    """The input image and its attribution map (summed over channels), side by side.

    Two panels with the same pixel grid, so a pixel's score sits at the same place as the
    pixel: scores painted over an image of noise (random example inputs) would hide both.
    Layer maps (GradCAM, a conv layer's conductance) are upsampled to the input's size.
    ``opacity`` is kept for callers of the earlier overlay and no longer used.

    >>> import torch
    >>> x = torch.rand(1, 3, 4, 4)
    >>> r = Attribution("saliency", "saliency", "Saliency", 0, None, None, (x,), (x,))
    >>> [type(t).__name__ for t in image_overlay(r).data]
    ['Image', 'Heatmap']
    """
    from plotly.subplots import make_subplots

    pixels = result.pixel_map(sample)
    if pixels is None:
        raise ValueError("image_overlay needs a (B, C, H, W) input and attribution")
    img = result.inputs[0][sample].float()  # (C, H, W)
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.08,
                        subplot_titles=("input", "attribution (summed over channels)"))
    if img.shape[0] == 3:
        lo, hi = float(img.min()), float(img.max())
        rgb = ((img - lo) / (hi - lo if hi > lo else 1.0) * 255).clamp(0, 255).byte()
        fig.add_trace(go.Image(z=rgb.permute(1, 2, 0).numpy(), hoverinfo="skip"), row=1, col=1)
    else:
        fig.add_trace(
            go.Heatmap(
                z=img.mean(0).numpy(),
                colorscale="gray",
                showscale=False,
                hovertemplate="x %{x}, y %{y}<br>value %{z:.4g}<extra></extra>",
            ),
            row=1,
            col=1,
        )
    fig.add_trace(go.Heatmap(
        z=pixels.astype(float), colorscale=DIVERGING, zmid=0, colorbar=dict(title="score", x=1.02),
        hovertemplate="x %{x}, y %{y}<br>score %{z:.4g}<extra></extra>"), row=1, col=2)
    fig.update_yaxes(autorange="reversed")
    fig.update_yaxes(scaleanchor="x", row=1, col=1)
    fig.update_yaxes(scaleanchor="x2", row=1, col=2)
    fig.update_layout(title=f"{result.captum_method} on {result.layer or 'inputs'}: "
                            f"sample {sample}, target {result.target}",
                      height=380, margin=dict(l=20, r=60, t=70, b=20))
    return fig


@escaped_figure
def conductance_bars(results: Attribution | list[Attribution], top: int = 32) -> go.Figure:
    """One result: total score of each unit (channel, neuron or position) of its layer, the
    ``top`` largest by magnitude. Several results: one bar per layer, its total score, with
    the output difference each should add up to where the method has a delta."""
    if isinstance(results, Attribution):
        s = _first_tensor(results.summary)
        total = lambda v: v.sum(skipna=False)  # noqa: E731 - a NaN stays NaN, never 0
        g = s.groupby("label", sort=False).agg(score=("score", total), abs_score=("abs_score", total),
                                               nans=("nans", "sum"))
        g = g.assign(order=g["abs_score"].fillna(np.inf)).sort_values("order", ascending=False).head(top)
        labels, values, nans = list(g.index), g["score"].to_numpy(dtype=float), g["nans"].to_numpy()
        title = f"{results.captum_method} per unit of {results.layer or 'inputs'}"
        if len(s["label"].unique()) > top:
            title += f" (top {top} of {len(s['label'].unique())} by |score|)"
        diff = None
    else:
        labels, values, nans, diffs = [], [], [], []
        for r in results:
            labels.append(r.layer or "inputs")
            layer_total = sum(float(a.double().sum()) for a in r.attributions)
            values.append(layer_total)
            nans.append(int(r.summary["nans"].sum()))
            comp = r.completeness()
            diffs.append(None if comp is None else float(sum(comp.output_diff)))
        values = np.asarray(values, dtype=float)
        title = "Total attribution per layer"
        diff = diffs
    fig = go.Figure(go.Bar(
        x=labels, y=values, marker_color=np.where(np.nan_to_num(values, nan=0.0) >= 0, "#2166ac", "#b2182b"),
        text=["NaN" if n else "" for n in nans], textposition="outside",
        hovertemplate="%{x}<br>score %{y:.4g}<extra></extra>"))
    if diff is not None and any(d is not None for d in diff):
        fig.add_trace(go.Scatter(x=labels, y=[np.nan if d is None else d for d in diff], mode="markers",
                                 marker=dict(symbol="line-ew-open", size=24, color="black"),
                                 name="F(x) − F(baseline)",
                                 hovertemplate="%{x}<br>F(x) − F(baseline) %{y:.4g}<extra></extra>"))
    fig.update_layout(title=title, yaxis_title="score", height=380, margin=dict(l=60, r=20, t=50, b=80),
                      showlegend=diff is not None)
    return readable(fig)


def completeness_line(result: Attribution) -> str:
    """One sentence on IG's completeness: the convergence delta and whether to trust the scores.

    >>> import torch
    >>> r = Attribution("ig", "ig", "IntegratedGradients", None, None, None,
    ...                       (torch.tensor([[2.0, 2.0, -3.0]]),), (torch.ones(1, 3),),
    ...                       delta=torch.tensor([0.001]))
    >>> print(completeness_line(r))  # doctest: +NORMALIZE_WHITESPACE
    Completeness: attributions sum to 1, F(x) − F(baseline) = 0.999, convergence delta 0.001 (0.1%):
    small enough to trust (tolerance 5%).
    """
    comp = result.completeness()
    if comp is None:
        return f"Completeness: {result.captum_method} has no convergence delta to check."
    total = float(sum(comp.output_diff) + sum(comp.delta))
    diff = float(sum(comp.output_diff))
    verdict = (f"small enough to trust (tolerance {comp.tolerance:.0%})" if comp.trusted else
               f"too large to trust (tolerance {comp.tolerance:.0%}); raise n_steps")
    if not np.isfinite(comp.max_abs_delta):
        verdict = "not finite: the attributions hold NaN or infinite values"
    return (f"Completeness: attributions sum to {total:.4g}, F(x) − F(baseline) = {diff:.4g}, "
            f"convergence delta {comp.max_abs_delta:.3g} ({comp.max_relative:.1%}): {verdict}.")


def _first_tensor(summary: pd.DataFrame) -> pd.DataFrame:
    return summary[summary["tensor"] == summary["tensor"].iloc[0]]
