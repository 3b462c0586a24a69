//! The page's one time axis: seconds into the run.
//!
//! The charts that span the whole run (the events chart, with its fault
//! marks and the fault codes above it, and the instances' lanes below it)
//! are built on one [`TimeAxis`], made once per page from the report: the
//! same span of time and the same left label area, so a firing's mark in
//! one chart stands above its mark in the other. Neither computes its
//! span or its label width itself, so the two cannot disagree.
//!
//! The anomalies' stories each draw their own window of time, but in the
//! same unit ([`seconds`]) and the same style ([`time_mesh`]).

use super::charts::{font, TEXT_PX, TITLE_PX};
use crate::report::Report;
use plotters::chart::MeshStyle;
use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;
use std::ops::Range;

/// A chart with seconds into the run along x and any span of f64 up y.
pub(super) type TimeChart<'a, DB> = ChartContext<'a, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// The width of the run-wide charts' left label area: the events chart's
/// counts, the lanes' instance names.
const LEFT_PX: u32 = 130;

/// A run-wide chart's margin on each side, and the height of the time
/// labels and title below its plot, in pixels.
pub(super) const MARGIN_PX: u32 = 12;
pub(super) const LABELS_PX: u32 = 44;

/// The time axis of the charts that span the run. It starts at 0; the
/// charts are all [`super::charts::WIDTH`] wide, so with the same end and
/// the same left label area their plots cover the same pixels.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct TimeAxis {
    /// The axis's end, in seconds into the run.
    pub end_s: f64,
    /// The width of the label area left of the plot, in pixels.
    pub left_px: u32,
}

impl TimeAxis {
    /// The axis of `r`'s page: to its last sample or fault, at least one
    /// second.
    pub fn of(r: &Report) -> Self {
        let end_ms = r
            .series
            .last()
            .map(|s| s.at_ms)
            .unwrap_or(0)
            .max(r.fault_log.iter().map(|f| f.at_ms).max().unwrap_or(0))
            .max(1000);
        TimeAxis { end_s: seconds(end_ms), left_px: LEFT_PX }
    }

    /// A chart on `area` with this axis along x and `y` up its side,
    /// its plot `top_px` below the area's top.
    pub fn plot<'a, DB: DrawingBackend>(
        &self,
        area: &'a DrawingArea<DB, Shift>,
        top_px: u32,
        y: Range<f64>,
    ) -> Result<TimeChart<'a, DB>, DrawingAreaErrorKind<DB::ErrorType>> {
        ChartBuilder::on(area)
            .margin(MARGIN_PX)
            .margin_top(top_px)
            .x_label_area_size(LABELS_PX)
            .y_label_area_size(self.left_px)
            .build_cartesian_2d(0f64..self.end_s, y)
    }
}

/// Milliseconds (a `u64` or an `i64`) as seconds into the run, the unit
/// of every time axis and time column of the page.
pub(super) fn seconds(ms: impl Into<i128>) -> f64 {
    ms.into() as f64 / 1000.0
}

/// The style of a time axis: its labels, its title and no light grid
/// lines. A chart adds its y axis's own before drawing it.
pub(super) fn time_mesh<'a, 'b, DB: DrawingBackend>(
    c: &'b mut TimeChart<'a, DB>,
) -> MeshStyle<'a, 'b, RangedCoordf64, RangedCoordf64, DB> {
    let mut style = c.configure_mesh();
    style
        .label_style(font(TEXT_PX))
        .axis_desc_style(font(TITLE_PX))
        .x_desc("seconds into the run")
        .light_line_style(WHITE);
    style
}
