"""The pair page: a pair's statistics, alignment and value inspector, its heatmap, and the inspector's grids for
the page's script."""

from __future__ import annotations

from litestar import Controller, Response, get
from litestar.di import NamedDependency
from litestar.params import FromPath, FromQuery
from litestar.response import Template

from tensor_debugger.compare.planning.sides import views
from tensor_debugger.compare.reports.heatmap import Heatmap, build_heatmap, heatmap_svg
from tensor_debugger.errors import NotFoundError
from tensor_debugger.services import Services
from tensor_debugger.store.models import PairRecord
from tensor_debugger.web.views.heatmap_image import HeatmapValues, heatmap_pixels, heatmap_values
from tensor_debugger.web.views.pair_page import ManualSide, pair_page_view, parse_fixed
from tensor_debugger.web.views.png import encode_png


def _heatmap(services: Services, pair_id: int, fixed: str) -> Heatmap:
    with services.sessions() as db:
        pair = db.get(PairRecord, pair_id)
        if pair is None:
            raise NotFoundError(f"no pair with id {pair_id}")
        view_a, view_b, alignment = views(services.store, db, pair)
        return build_heatmap(view_a, view_b, parse_fixed(alignment.shape, fixed))


class PairPageController(Controller):
    path = "/"
    include_in_schema = False

    @get("/pairs/{pair_id:int}", sync_to_thread=True)
    def pair_page(
        self,
        services: NamedDependency[Services],
        pair_id: FromPath[int],
        index: FromQuery[str] = "",
        start: FromQuery[str] = "",
        count: FromQuery[str] = "",
        mode: FromQuery[str] = "",
        a_shard: FromQuery[int] = 0,
        a_index: FromQuery[str] = "",
        a_start: FromQuery[str] = "",
        a_count: FromQuery[str] = "",
        b_shard: FromQuery[int] = 0,
        b_index: FromQuery[str] = "",
        b_start: FromQuery[str] = "",
        b_count: FromQuery[str] = "",
        profile: FromQuery[str] = "",
    ) -> Template:
        """A pair's statistics, alignment and the value inspector; the window lives in the URL. `mode=manual`
        adds each run's own values with its own dimension controls (a_* and b_* parameters); `profile=D` plots the
        error profile along aligned dimension D."""
        manual = (
            {"a": ManualSide(a_shard, a_index, a_start, a_count), "b": ManualSide(b_shard, b_index, b_start, b_count)}
            if mode == "manual"
            else None
        )
        with services.sessions() as db:
            page = pair_page_view(db, services, pair_id, index, start, count, manual, profile)
            return Template("pair.html", context=page.template_context())

    @get("/pairs/{pair_id:int}/heatmap.svg", sync_to_thread=True, media_type="image/svg+xml")
    def pair_heatmap(
        self, services: NamedDependency[Services], pair_id: FromPath[int], fixed: FromQuery[str] = ""
    ) -> Response[str]:
        """|difference| over a 2-D slice (`fixed`: an index per aligned dim, ':' on two), max-pooled, as SVG with
        its axes, colour scale and a title per cell (a file to keep; the page shows the PNG)."""
        return Response(heatmap_svg(_heatmap(services, pair_id, fixed)), media_type="image/svg+xml")

    @get("/pairs/{pair_id:int}/heatmap.png", sync_to_thread=True, media_type="image/png")
    def pair_heatmap_png(
        self, services: NamedDependency[Services], pair_id: FromPath[int], fixed: FromQuery[str] = ""
    ) -> Response[bytes]:
        """The same heatmap as a PNG of a pixel per cell, for the page to scale up."""
        return Response(encode_png(heatmap_pixels(_heatmap(services, pair_id, fixed))), media_type="image/png")

    @get("/pairs/{pair_id:int}/heatmap.json", sync_to_thread=True)
    def pair_heatmap_values(
        self, services: NamedDependency[Services], pair_id: FromPath[int], fixed: FromQuery[str] = ""
    ) -> HeatmapValues:
        """Each cell's largest signed difference as text, the cells' edges and the colour scale's ends."""
        return heatmap_values(_heatmap(services, pair_id, fixed))

    @get("/pairs/{pair_id:int}/grid", sync_to_thread=True)
    def pair_grid(
        self,
        services: NamedDependency[Services],
        pair_id: FromPath[int],
        index: FromQuery[str] = "",
        start: FromQuery[str] = "",
        count: FromQuery[str] = "",
    ) -> Template:
        """Just the inspector's grids, for the page's script to swap in without a reload."""
        with services.sessions() as db:
            page = pair_page_view(db, services, pair_id, index, start, count)
            return Template("_inspector.html", context=page.template_context())
